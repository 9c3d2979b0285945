//! `cordon render kubernetes`: every rendered object validates against the
//! official Kubernetes OpenAPI schemas of three minor versions (strict: no
//! unknown field), offline, with kubernetes-validate (installed by
//! scripts/setup.sh); a broken object is rejected by the same validator;
//! a weakening manifest change shows in the rendered objects and in
//! `cordon diff`; a NetworkPolicy that widens a sandbox's egress is
//! reported; `--agent-sandbox` renders the v1beta1 CRDs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cordon_testkit::skip::skip_or_fail;
use serde_json::Value;

/// Kubernetes minor versions every object must validate against.
const VERSIONS: [&str; 3] = ["1.33.0", "1.35.0", "1.37.0"];

/// A digest for examples/jira.yaml's `DIGEST` (scripts/demo.sh writes the
/// built image's there).
const DIGEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn cordon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .env_remove("CORDON_MANIFEST")
        .output()
        .expect("run cordon")
}

fn render(manifest: &Path, extra: &[&str]) -> Output {
    let m = manifest.to_str().expect("utf-8 path");
    let mut args = vec!["render", "kubernetes", "-m", m];
    args.extend_from_slice(extra);
    cordon(&args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(yaml).expect("rendered YAML parses")
}

fn kind(d: &Value) -> &str {
    d["kind"].as_str().unwrap_or("")
}

fn named<'a>(docs: &'a [Value], k: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| kind(d) == k && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {k} {name} in {docs:#?}"))
}

/// kubernetes-validate as scripts/setup.sh installs it, or why not.
fn validator() -> Result<PathBuf, String> {
    let dir = std::env::var_os("CORDON_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e"))
        .join("kubernetes-validate");
    if !dir.join("done").is_file() {
        return Err(format!(
            "{} is missing: scripts/setup.sh installs kubernetes-validate there",
            dir.join("done").display()
        ));
    }
    Ok(dir.join("lib"))
}

/// Validate `file` strictly against one Kubernetes version: (passed, output).
fn validate(lib: &Path, version: &str, file: &Path) -> (bool, String) {
    let o = Command::new("/usr/bin/python3")
        .args(["-m", "kubernetes_validate", "--strict", "-k", version])
        .arg(file)
        .env("PYTHONPATH", lib)
        .output()
        .expect("run python3");
    let text = format!("{}{}", stdout(&o), stderr(&o));
    (o.status.success(), text)
}

/// The example manifests with P2/P3 tools (and the main one), jira.yaml
/// with a digest in place of its `DIGEST`.
fn manifests(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [
        "cordon.yaml",
        "images.yaml",
        "microvm.yaml",
        "browse.yaml",
        "playwright-mcp.yaml",
    ]
    .iter()
    .map(|f| examples().join(f))
    .collect();
    let jira = std::fs::read_to_string(examples().join("jira.yaml"))
        .unwrap()
        .replace("sha256:DIGEST", &format!("sha256:{DIGEST}"));
    let p = dir.join("jira.yaml");
    std::fs::write(&p, jira).unwrap();
    out.push(p);
    let browse = std::fs::read_to_string(examples().join("browse-microvm.yaml"))
        .unwrap()
        .replace("sha256:DIGEST", &format!("sha256:{DIGEST}"));
    let p = dir.join("browse-microvm.yaml");
    std::fs::write(&p, browse).unwrap();
    out.push(p);
    out
}

#[test]
fn every_rendered_object_validates_against_three_kubernetes_versions() {
    let lib = match validator() {
        Ok(l) => l,
        Err(why) => {
            skip_or_fail(
                "every_rendered_object_validates_against_three_kubernetes_versions",
                &why,
            );
            return;
        }
    };
    let dir = cordon_testkit::scratch::scratch();
    let mut kinds = std::collections::BTreeSet::new();
    let mut files = Vec::new();
    for m in manifests(dir.path()) {
        let o = render(&m, &[]);
        assert!(o.status.success(), "{}: {}", m.display(), stderr(&o));
        let yaml = stdout(&o);
        let docs = documents(&yaml);
        kinds.extend(docs.iter().map(|d| kind(d).to_string()));
        let f = dir.path().join(format!(
            "{}.k8s.yaml",
            m.file_stem().unwrap().to_string_lossy()
        ));
        std::fs::write(&f, &yaml).unwrap();
        files.push((f, docs.len()));
    }
    // With --agent-sandbox, the core objects (all but the agent-sandbox
    // CRDs, which the core schemas do not have) validate too.
    let jira = dir.path().join("jira.yaml");
    let o = render(&jira, &["--agent-sandbox"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let core: Vec<Value> = documents(&stdout(&o))
        .into_iter()
        .filter(|d| {
            !d["apiVersion"]
                .as_str()
                .unwrap_or("")
                .contains("agents.x-k8s.io")
        })
        .collect();
    let text: String = core
        .iter()
        .map(|d| format!("---\n{}\n", serde_json::to_string(d).unwrap()))
        .collect();
    let f = dir.path().join("jira-agent-sandbox.k8s.yaml");
    std::fs::write(&f, text).unwrap();
    files.push((f, core.len()));
    // Every kind the issue asks for is among what was validated.
    for k in [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Service",
        "NetworkPolicy",
        "PodTemplate",
        "Deployment",
        "PodDisruptionBudget",
    ] {
        assert!(kinds.contains(k), "no {k} rendered: {kinds:?}");
    }
    for v in VERSIONS {
        for (f, n) in &files {
            let (ok, text) = validate(&lib, v, f);
            assert!(ok, "{} against {v}:\n{text}", f.display());
            assert!(!text.contains("ERROR"), "{text}");
            // Each document was checked (none skipped as of an unknown kind).
            assert_eq!(text.matches(" passed for resource ").count(), *n, "{text}");
        }
    }

    // The positive control: the same validator rejects an unknown field in
    // a rendered object (so the test can fail).
    let images = documents(&std::fs::read_to_string(&files[1].0).unwrap());
    let mut broken = named(&images, "PodTemplate", "cordon-tool-shout").clone();
    broken["template"]["spec"]["containers"][0]["securityContext"]["privilegedMode"] =
        Value::Bool(false);
    let bad = dir.path().join("broken.yaml");
    std::fs::write(&bad, serde_json::to_string(&broken).unwrap()).unwrap();
    for v in VERSIONS {
        let (ok, text) = validate(&lib, v, &bad);
        assert!(!ok, "a broken object passed against {v}:\n{text}");
        assert!(
            text.contains("'privilegedMode' was unexpected"),
            "against {v}: {text}"
        );
    }
}

#[test]
fn tools_not_rendered_as_pods_are_named_on_stderr() {
    let o = render(&examples().join("cordon.yaml"), &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    for p1 in ["pdf_to_text", "thumbnail", "word_count"] {
        assert!(
            err.contains(&format!(
                "note: {p1}: not rendered as a Pod: a P1 tool runs in the broker's own pod"
            )),
            "{err}"
        );
    }
    assert!(
        err.contains("note: scratch: not rendered: a Pod runs an image"),
        "{err}"
    );
    let docs = documents(&stdout(&o));
    assert!(docs.iter().all(|d| d["metadata"]["namespace"] == "cordon"));
    let deployment = named(&docs, "Deployment", "cordon");
    assert_eq!(
        deployment["spec"]["template"]["metadata"]["annotations"]["cordon.dev/in-broker"],
        "pdf_to_text,thumbnail,word_count"
    );
    assert!(!docs.iter().any(|d| kind(d) == "PodTemplate"));
}

const BASE: &str = r#"version: 1
tools:
  shout:
    profile: P2
    description: Upper-case a text.
    image: busybox@sha256:5100fc600753f3649a76aed513731c73a910ef351a5d7d0fed2e1403aace62c2
    command: ["/bin/sh", "-c", "tr a-z A-Z"]
    network: none
    limits: {wall_seconds: 5, memory: 64M, tasks: 8, output_bytes: 4K}
"#;

/// A weakening of every kind at once: an egress host, more memory, a
/// writable workspace.
const WEAKER: &str = r#"version: 1
tools:
  shout:
    profile: P2
    description: Upper-case a text.
    image: busybox@sha256:5100fc600753f3649a76aed513731c73a910ef351a5d7d0fed2e1403aace62c2
    command: ["/bin/sh", "-c", "tr a-z A-Z"]
    egress: ["api.example:443"]
    limits: {wall_seconds: 5, memory: 256M, tasks: 8, output_bytes: 4K}
    workspace: {mount: /work, size: 16M}
"#;

fn container(docs: &[Value]) -> &Value {
    &named(docs, "PodTemplate", "cordon-tool-shout")["template"]["spec"]["containers"][0]
}

#[test]
fn a_weakening_change_shows_in_the_rendered_objects_and_in_diff() {
    let dir = cordon_testkit::scratch::scratch();
    let base = dir.path().join("base.yaml");
    let weaker = dir.path().join("weaker.yaml");
    std::fs::write(&base, BASE).unwrap();
    std::fs::write(&weaker, WEAKER).unwrap();
    let a = render(&base, &[]);
    let b = render(&weaker, &[]);
    assert!(
        a.status.success() && b.status.success(),
        "{}{}",
        stderr(&a),
        stderr(&b)
    );
    let (a, b) = (documents(&stdout(&a)), documents(&stdout(&b)));

    // Memory: requests and limits follow the policy.
    assert_eq!(container(&a)["resources"]["limits"]["memory"], "67108864");
    assert_eq!(container(&b)["resources"]["limits"]["memory"], "268435456");
    assert_eq!(
        container(&b)["resources"]["requests"]["memory"],
        "268435456"
    );
    // Egress: no door before; after, the tool's own NetworkPolicy to its
    // proxy port, the proxy Service, the proxy in its environment.
    let egress = |d: &[Value]| {
        d.iter().any(|d| {
            kind(d) == "NetworkPolicy" && d["metadata"]["name"] == "cordon-tool-shout-egress"
        })
    };
    assert!(!egress(&a) && egress(&b));
    assert!(!a.iter().any(|d| d["metadata"]["name"] == "cordon-egress"));
    let np = named(&b, "NetworkPolicy", "cordon-tool-shout-egress");
    assert_eq!(np["spec"]["egress"][0]["ports"][0]["port"], 3128);
    assert_eq!(
        np["spec"]["egress"][0]["to"][0]["podSelector"]["matchLabels"]["cordon.dev/role"],
        "broker"
    );
    named(&b, "Service", "cordon-egress");
    let env = |d: &[Value]| container(d)["env"].as_array().cloned().unwrap_or_default();
    assert!(!env(&a).iter().any(|e| e["name"] == "HTTPS_PROXY"));
    assert!(
        env(&b).iter().any(|e| e["name"] == "HTTPS_PROXY"
            && e["value"] == "http://$(CORDON_EGRESS_SERVICE_HOST):3128")
    );
    // Read-only: one more writable path, memory-backed and capped.
    let mounts = |d: &[Value]| {
        container(d)["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    assert!(!mounts(&a).iter().any(|m| m["mountPath"] == "/work"));
    assert!(
        mounts(&b)
            .iter()
            .any(|m| m["mountPath"] == "/work" && m["readOnly"] == false)
    );
    let vols = named(&b, "PodTemplate", "cordon-tool-shout")["template"]["spec"]["volumes"].clone();
    assert!(
        vols.as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "workspace"
                && v["emptyDir"]["medium"] == "Memory"
                && v["emptyDir"]["sizeLimit"] == "16777216"),
        "{vols:#}"
    );

    // `cordon diff` flags each as weakening (exit 1).
    let d = cordon(&["diff", base.to_str().unwrap(), weaker.to_str().unwrap()]);
    assert_eq!(d.status.code(), Some(1), "{}", stdout(&d));
    let out = stdout(&d);
    for field in ["shout: limits.memory", "shout: egress", "shout: workspace"] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("WEAKENS") && l.contains(field)),
            "{field} not flagged:\n{out}"
        );
    }
}

#[test]
fn a_network_policy_that_widens_a_sandboxs_egress_is_reported() {
    let dir = cordon_testkit::scratch::scratch();
    let m = dir.path().join("m.yaml");
    std::fs::write(&m, WEAKER).unwrap();
    let wide = dir.path().join("wide.yaml");
    std::fs::write(
        &wide,
        r#"apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-all-out, namespace: cordon}
spec:
  podSelector: {matchLabels: {cordon.dev/role: sandbox}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 0.0.0.0/0}}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-out, namespace: cordon}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 0.0.0.0/0}}]
"#,
    )
    .unwrap();
    let o = render(&m, &["--existing", wide.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("NetworkPolicy allow-all-out")
            && err.contains("widens the egress of tool shout's sandbox pods")
            && err.contains("ipBlock 0.0.0.0/0 on any port"),
        "{err}"
    );
    // The policy for other pods is not reported; the objects are printed.
    assert!(!err.contains("web-out"), "{err}");
    assert!(!documents(&stdout(&o)).is_empty());

    // The control: only the policy that selects other pods, nothing reported.
    let other = dir.path().join("other.yaml");
    let text = std::fs::read_to_string(&wide).unwrap();
    std::fs::write(&other, text.split("---\n").nth(1).unwrap()).unwrap();
    let o = render(&m, &["--existing", other.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("widens"), "{}", stderr(&o));
}

#[test]
fn agent_sandbox_renders_v1beta1_templates_and_warm_pools() {
    let dir = cordon_testkit::scratch::scratch();
    let m = dir.path().join("pool.yaml");
    std::fs::write(
        &m,
        BASE.replace(
            "    network: none\n",
            "    network: none\n    lifetime: pool\n    pool: {size: 3}\n",
        ),
    )
    .unwrap();
    let o = render(&m, &["--agent-sandbox"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let docs = documents(&stdout(&o));
    assert!(!docs.iter().any(|d| kind(d) == "PodTemplate"));
    let t = named(&docs, "SandboxTemplate", "cordon-tool-shout");
    assert_eq!(t["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    let spec = &t["spec"]["podTemplate"]["spec"];
    assert_eq!(
        spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    assert_eq!(spec["automountServiceAccountToken"], false);
    let p = named(&docs, "SandboxWarmPool", "cordon-tool-shout");
    assert_eq!(p["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(p["spec"]["replicas"], 3);
    assert_eq!(p["spec"]["sandboxTemplateRef"]["name"], "cordon-tool-shout");
    // The broker may claim sandboxes, in its namespace only.
    let role = named(&docs, "Role", "cordon");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["apiGroups"][0] == "extensions.agents.x-k8s.io"
                && r["resources"][0] == "sandboxclaims")
    );
    assert!(!docs.iter().any(|d| kind(d).starts_with("Cluster")));
}

#[test]
fn the_namespace_is_every_objects_and_must_be_a_label() {
    let m = examples().join("images.yaml");
    let o = render(&m, &["--namespace", "agents"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let docs = documents(&stdout(&o));
    assert!(docs.iter().all(|d| d["metadata"]["namespace"] == "agents"));
    let o = render(&m, &["--namespace", "Agents_1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--namespace Agents_1: a namespace is a DNS label"),
        "{}",
        stderr(&o)
    );
    assert!(o.stdout.is_empty());
}
