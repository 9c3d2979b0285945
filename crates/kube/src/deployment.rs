//! The broker: `cordon serve` over streamable HTTP, with a hardened
//! security context, the manifest from its ConfigMap, audit records on
//! stderr (the cluster's log collection keeps them), and the
//! ServiceAccount's token (the only pods that get it).

use std::collections::BTreeMap;

use cordon_policy::policy::ToolPolicy;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile,
    SecurityContext, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::config_map::MANIFEST_KEY;
use crate::names;
use crate::service::{MCP_PORT, proxy_port_name};

/// The broker's uid and gid (non-root).
pub const BROKER_UID: i64 = 65532;
/// Broker replicas (a drain keeps one: the PodDisruptionBudget).
pub const REPLICAS: i32 = 2;
/// The annotation listing the P1 tools the broker runs in its own pod.
pub const IN_BROKER: &str = "cordon.dev/in-broker";

/// The broker's Deployment; `in_broker`: the P1 tools it runs in its own
/// pod; `proxy_ports`: the egress proxy's ports, one per networked tool.
pub fn deployment(
    ns: &str,
    image: &str,
    in_broker: &[&ToolPolicy],
    proxy_ports: &[i32],
) -> Deployment {
    let labels = names::broker_labels();
    let mut annotations = BTreeMap::new();
    if !in_broker.is_empty() {
        let list: Vec<&str> = in_broker.iter().map(|p| p.name.as_str()).collect();
        annotations.insert(IN_BROKER.to_string(), list.join(","));
    }
    let mut ports = vec![ContainerPort {
        name: Some("mcp".into()),
        container_port: MCP_PORT,
        protocol: Some("TCP".into()),
        ..Default::default()
    }];
    ports.extend(proxy_ports.iter().map(|&n| ContainerPort {
        name: Some(proxy_port_name(n)),
        container_port: n,
        protocol: Some("TCP".into()),
        ..Default::default()
    }));
    let manifest = format!("/etc/cordon/{MANIFEST_KEY}");
    let container = Container {
        name: "broker".into(),
        image: Some(image.into()),
        args: Some(
            [
                "serve",
                "-m",
                &manifest,
                "--http",
                &format!("0.0.0.0:{MCP_PORT}"),
                "--allow-host",
                &format!("{}.{ns}.svc", names::BROKER),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ),
        env: Some(vec![EnvVar {
            name: "CORDON_AUDIT".into(),
            value: Some("-".into()),
            value_from: None,
        }]),
        ports: Some(ports),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(MCP_PORT),
                host: None,
            }),
            period_seconds: Some(10),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("250m".into())),
                ("memory".to_string(), Quantity("256Mi".into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("1Gi".into()),
            )])),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(BROKER_UID),
            run_as_group: Some(BROKER_UID),
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "manifest".into(),
                mount_path: "/etc/cordon".into(),
                read_only: Some(true),
                ..Default::default()
            },
            VolumeMount {
                name: "state".into(),
                mount_path: "/var/lib/cordon".into(),
                ..Default::default()
            },
            VolumeMount {
                name: "tmp".into(),
                mount_path: "/tmp".into(),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let empty = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    };
    Deployment {
        metadata: names::meta(names::BROKER, ns, labels.clone()),
        spec: DeploymentSpec {
            replicas: Some(REPLICAS),
            selector: names::broker_selector(),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: (!annotations.is_empty()).then_some(annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(names::BROKER.into()),
                    automount_service_account_token: Some(true),
                    enable_service_links: Some(false),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            localhost_profile: None,
                        }),
                        ..Default::default()
                    }),
                    containers: vec![container],
                    volumes: Some(vec![
                        Volume {
                            name: "manifest".into(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: names::MANIFEST.into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        empty("state"),
                        empty("tmp"),
                    ]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        },
        status: None,
    }
}
