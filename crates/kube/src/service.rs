//! The broker's Services: `cordon` (MCP over streamable HTTP) and
//! `cordon-egress`, the egress proxy, one port per networked tool (the
//! port tells the proxy whose allowlist applies).

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::Sandbox;
use crate::names;

/// The port `cordon serve --http` listens on in the broker's pod.
pub const MCP_PORT: i32 = 8765;

fn port(name: &str, n: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port: n,
        target_port: Some(IntOrString::Int(n)),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

/// The MCP endpoint. A session lives in one broker replica, so a client
/// sticks to one.
pub fn broker(ns: &str) -> Service {
    Service {
        metadata: names::meta(names::BROKER, ns, names::broker_labels()),
        spec: Some(ServiceSpec {
            selector: Some(names::broker_labels()),
            ports: Some(vec![port("mcp", MCP_PORT)]),
            session_affinity: Some("ClientIP".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// The name of a proxy port (at most 15 characters).
pub fn proxy_port_name(n: i32) -> String {
    format!("proxy-{n}")
}

/// The egress proxy, or `None` when no tool has a network (a Service
/// needs a port).
pub fn egress_proxy(ns: &str, sandboxes: &[Sandbox]) -> Option<Service> {
    let ports: Vec<ServicePort> = sandboxes
        .iter()
        .filter_map(|s| s.proxy_port)
        .map(|n| port(&proxy_port_name(n), n))
        .collect();
    if ports.is_empty() {
        return None;
    }
    Some(Service {
        metadata: names::meta(names::EGRESS, ns, names::broker_labels()),
        spec: Some(ServiceSpec {
            selector: Some(names::broker_labels()),
            ports: Some(ports),
            ..Default::default()
        }),
        status: None,
    })
}
