//! A P2/P3 tool's sandbox as a Pod template: the image by digest, the
//! hardened security context, requests and limits from the policy's
//! limits, the wall clock as `activeDeadlineSeconds`, the runtime class,
//! memory-backed `emptyDir`s for the writable paths, and the session's CA
//! bundle and credential placeholders from the session Secret. Nothing
//! else: no service account token, no host path, no host namespace.

use std::collections::BTreeMap;

use cordon_policy::policy::{Exec, Profile, Runtime, ToolPolicy};
use cordon_policy::resolve::{SANDBOX_PATH, split_digest};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, KeyToPath,
    PodSecurityContext, PodSpec, PodTemplate, PodTemplateSpec, ProjectedVolumeSource,
    ResourceRequirements, SeccompProfile, SecretKeySelector, SecretProjection, SecurityContext,
    Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::Note;
use crate::names;

/// The uid and gid a sandbox runs as (the sandbox layout's default user).
pub const SANDBOX_UID: i64 = 1000;
/// The session Secret the broker writes for each session: the session
/// CA's certificate bundle (never its key) and one placeholder per
/// credential (never a credential). The template names it; the broker
/// names each session's copy.
pub const SESSION_SECRET: &str = "cordon-session";
/// The key of the trust bundle in the session Secret.
pub const CA_BUNDLE_KEY: &str = "ca-bundle.pem";
/// Where the trust bundle is mounted.
pub const CA_DIR: &str = "/etc/cordon/ca";
/// The container's name in every sandbox pod.
pub const CONTAINER: &str = "tool";

/// Variables that name a trust bundle for the usual TLS stacks (the list
/// of cordon-runtime's supervisor, `TRUST_BUNDLE_ENV`).
pub const TRUST_BUNDLE_ENV: [&str; 7] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
];

/// The image (`name@sha256:...`) a tool's Pod runs, or why the tool is not
/// rendered as a Pod.
pub fn renders_as_pod(p: &ToolPolicy) -> Result<String, String> {
    match p.profile {
        Profile::P0 => {
            return Err(
                "not rendered: profile P0 has no sandbox (cordon runs only sandboxed tools)".into(),
            );
        }
        Profile::P1 => {
            return Err(
                "not rendered as a Pod: a P1 tool runs in the broker's own pod, in the \
                 native parser jail (the Deployment's `cordon.dev/in-broker` annotation lists it); \
                 that jail needs user namespaces, which the broker's hardened pod may not \
                 have: `cordon check` in the pod says"
                    .into(),
            );
        }
        Profile::P2 | Profile::P3 => {}
    }
    let no_image = "not rendered: a Pod runs an image, and this tool runs the host's files \
                    (`command:`); give it `image: NAME@sha256:<digest>` (or `mcp: {image: ...}`)";
    match &p.exec {
        Exec::Image {
            reference, digest, ..
        } => Ok(format!("{reference}@{digest}")),
        Exec::Mcp {
            image: Some(image), ..
        } => split_digest(image)
            .map(|_| image.clone())
            .map_err(|e| format!("not rendered: {e}")),
        Exec::Mcp { image: None, .. } | Exec::Command { .. } => Err(no_image.into()),
        Exec::Wasm { .. } => Err(
            "not rendered as a Pod: a wasm tool (P1) runs in the broker's own pod, in the native jail"
                .into(),
        ),
        Exec::Unspecified => Err("not rendered: the manifest gives nothing to run".into()),
    }
}

/// The runtime class a runtime's pods ask for (`None`: the cluster's
/// default, runc: namespaces, seccomp and cgroups, as the native runtime).
pub fn runtime_class(r: Runtime) -> Option<&'static str> {
    match r {
        // A wasm tool runs in the broker's pod (never a Pod of its own).
        Runtime::Native | Runtime::Wasm => None,
        Runtime::Gvisor => Some("gvisor"),
        Runtime::Microvm => Some("kata"),
    }
}

/// The command that replaces the image's entrypoint, if the manifest
/// gives one.
fn command(p: &ToolPolicy) -> Option<Vec<String>> {
    match &p.exec {
        Exec::Image { command, .. } | Exec::Mcp { command, .. } => command.clone(),
        _ => None,
    }
}

fn quantity(n: u64) -> Quantity {
    Quantity(n.to_string())
}

/// Requests equal to limits (the Guaranteed class: nothing is borrowed
/// from the node): memory, CPU when the policy has a quota, and
/// ephemeral storage as the policy's disk.
pub fn resources(p: &ToolPolicy) -> ResourceRequirements {
    let mut r = BTreeMap::new();
    if let Some(l) = &p.limits {
        r.insert("memory".to_string(), quantity(l.memory_bytes));
        r.insert("ephemeral-storage".to_string(), quantity(l.disk_bytes));
        if let Some(cpu) = l.cpu_percent {
            r.insert(
                "cpu".to_string(),
                Quantity(format!("{}m", u64::from(cpu) * 10)),
            );
        }
    }
    ResourceRequirements {
        limits: Some(r.clone()),
        requests: Some(r),
        ..Default::default()
    }
}

fn seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        localhost_profile: None,
    }
}

/// The container's security context: non-root, no privilege escalation,
/// every capability dropped, a read-only root, the runtime's default
/// seccomp profile.
pub fn container_security() -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SANDBOX_UID),
        run_as_group: Some(SANDBOX_UID),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        seccomp_profile: Some(seccomp()),
        ..Default::default()
    }
}

/// The pod's security context (the same user and seccomp profile).
pub fn pod_security() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(SANDBOX_UID),
        run_as_group: Some(SANDBOX_UID),
        seccomp_profile: Some(seccomp()),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn memory_dir(name: &str, size: u64) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(quantity(size)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The Pod template of a tool that [`renders_as_pod`] as `image`;
/// `proxy_port`: its port of the egress proxy Service, when it has a
/// network. The notes say what of the policy a Pod does not carry.
pub fn pod_template(
    p: &ToolPolicy,
    image: &str,
    ns: &str,
    proxy_port: Option<i32>,
) -> (PodTemplate, Vec<Note>) {
    let mut notes = Vec::new();
    let name = names::sandbox_name(&p.name);
    let labels = names::sandbox_labels(&p.name);
    let mut env_vars: Vec<EnvVar> = p
        .env
        .iter()
        // cordon's default PATH yields to the image's own.
        .filter(|(k, v)| !(k.as_str() == "PATH" && v.as_str() == SANDBOX_PATH))
        .map(|(k, v)| env(k, v))
        .collect();
    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    let disk = p.limits.map(|l| l.disk_bytes).unwrap_or(64 << 20);
    volumes.push(memory_dir("tmp", disk));
    mounts.push(mount("tmp", "/tmp", false));
    if let Some(w) = &p.workspace {
        volumes.push(memory_dir("workspace", w.size_bytes));
        mounts.push(mount("workspace", &w.mount, false));
    }
    if let Some(s) = &p.state {
        volumes.push(memory_dir("state", s.size_bytes));
        mounts.push(mount("state", &s.mount, false));
        notes.push(Note {
            tool: p.name.clone(),
            message: format!(
                "state at {}: an emptyDir of the pod's life, not kept across sessions \
                 (per-tenant volumes are not rendered yet)",
                s.mount
            ),
        });
    }
    for m in &p.mounts {
        notes.push(Note {
            tool: p.name.clone(),
            message: format!(
                "mount {}:{}{} not rendered: a hostPath volume would give the sandbox the \
                 node's files; put them in the image",
                m.src,
                m.dst,
                if m.writable { ":rw" } else { "" }
            ),
        });
    }
    if let Some(port) = proxy_port {
        // Service links give the proxy's address without a name lookup:
        // the sandbox has no resolver to reach (the proxy resolves).
        let proxy = format!("http://$(CORDON_EGRESS_SERVICE_HOST):{port}");
        for v in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            env_vars.push(env(v, &proxy));
        }
        let bundle = format!("{CA_DIR}/{CA_BUNDLE_KEY}");
        for v in TRUST_BUNDLE_ENV {
            env_vars.push(env(v, &bundle));
        }
        volumes.push(Volume {
            name: "session-ca".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![VolumeProjection {
                    secret: Some(SecretProjection {
                        name: SESSION_SECRET.into(),
                        items: Some(vec![KeyToPath {
                            key: CA_BUNDLE_KEY.into(),
                            path: CA_BUNDLE_KEY.into(),
                            ..Default::default()
                        }]),
                        optional: Some(false),
                    }),
                    ..Default::default()
                }]),
                default_mode: Some(0o444),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("session-ca", CA_DIR, true));
    }
    for s in &p.secrets {
        // A placeholder the egress door swaps for the credential; the
        // credential itself never enters the pod.
        env_vars.push(EnvVar {
            name: s.name.clone(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: SESSION_SECRET.into(),
                    key: format!("placeholder.{}", s.name),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
        });
    }
    let container = Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        command: command(p),
        env: Some(env_vars),
        // The broker speaks to the tool on its stdin and stdout (attach).
        stdin: Some(true),
        stdin_once: Some(true),
        resources: Some(resources(p)),
        security_context: Some(container_security()),
        volume_mounts: Some(mounts),
        ..Default::default()
    };
    let mut annotations = BTreeMap::new();
    annotations.insert(names::TOOL_ANNOTATION.to_string(), p.name.clone());
    annotations.insert("cordon.dev/profile".to_string(), format!("{:?}", p.profile));
    let spec = PodSpec {
        automount_service_account_token: Some(false),
        enable_service_links: Some(proxy_port.is_some()),
        restart_policy: Some("Never".into()),
        active_deadline_seconds: p
            .limits
            .map(|l| i64::try_from(l.wall.as_secs().max(1)).unwrap_or(i64::MAX)),
        termination_grace_period_seconds: Some(5),
        runtime_class_name: runtime_class(p.runtime).map(str::to_string),
        security_context: Some(pod_security()),
        containers: vec![container],
        volumes: Some(volumes),
        ..Default::default()
    };
    let template = PodTemplate {
        metadata: ObjectMeta {
            annotations: Some(annotations.clone()),
            ..names::meta(&name, ns, labels.clone())
        },
        template: Some(PodTemplateSpec {
            metadata: Some(ObjectMeta {
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            }),
            spec: Some(spec),
        }),
    };
    (template, notes)
}
