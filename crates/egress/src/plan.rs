//! The door plan: what the jail must create inside the tool's empty network namespace.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ipnet::{IpNet, Ipv4Net};

use crate::policy::{EgressPolicy, HostPattern};

/// The reserved range the DNS door hands addresses out of when it cannot answer a real one
/// (a name without IPv4 addresses, doors without [`crate::Doors::local`]), assigned to `lo` in
/// the sandbox.
pub const DOOR_RANGE: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(198, 18, 0, 0), 15) {
    Ok(n) => n,
    Err(_) => panic!("198.18.0.0/15 is a valid prefix"),
};

/// The cloud metadata address: the DNS door never answers it, whatever `allow_cidrs` says.
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// Preferred address of the proxy door.
pub const PROXY_DOOR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 3128);

/// Address of the DNS door: glibc with no `/etc/resolv.conf` asks 127.0.0.1:53.
pub const DNS_DOOR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 53);

/// What to set up inside the sandbox's network namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DoorPlan {
    /// Ranges to assign to `lo` (198.18.0.0/15, plus each allowed IPv4 literal as a /32 so a
    /// tool that dials it lands on a transparent listener).
    pub local_cidrs: Vec<IpNet>,
    /// The proxy door, also the first entry of `tcp`; `None` when nothing is allowed.
    pub proxy: Option<SocketAddr>,
    /// TCP listeners to create: the proxy door, then `0.0.0.0:PORT` per allowed port.
    pub tcp: Vec<SocketAddr>,
    /// UDP sockets to create: the DNS door.
    pub udp: Vec<SocketAddr>,
    /// Environment for the tool: the proxy variables, `NO_PROXY` empty.
    pub env: Vec<(String, String)>,
}

impl DoorPlan {
    /// True when the tool needs no doors at all (its policy allows nothing).
    pub fn is_empty(&self) -> bool {
        self.tcp.is_empty() && self.udp.is_empty()
    }
}

/// Compute the door plan for a policy. A policy that allows nothing gets an empty plan: the
/// tool keeps an empty network namespace.
pub fn plan(policy: &EgressPolicy) -> DoorPlan {
    if policy.is_closed() {
        return DoorPlan::default();
    }
    let ports = policy.transparent_ports();
    // The proxy door must not collide with a transparent listener on 0.0.0.0:PORT.
    let mut proxy_port = PROXY_DOOR.port();
    while ports.contains(&proxy_port) {
        // Wraps past 65535 to 1024: some port is free, there are fewer ports than that.
        proxy_port = proxy_port.checked_add(1).unwrap_or(1024);
    }
    let proxy = SocketAddr::new(PROXY_DOOR.ip(), proxy_port);
    let mut tcp = vec![proxy];
    tcp.extend(
        ports
            .iter()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), *p)),
    );
    let mut local_cidrs = vec![IpNet::V4(DOOR_RANGE)];
    for hp in &policy.allow {
        if let HostPattern::Ip(IpAddr::V4(a)) = hp.host
            && !a.is_loopback()
            && !DOOR_RANGE.contains(&a)
        {
            let net = IpNet::V4(Ipv4Net::from(a));
            if !local_cidrs.contains(&net) {
                local_cidrs.push(net);
            }
        }
    }
    let url = format!("http://{proxy}");
    let mut env: Vec<(String, String)> = [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
    ]
    .iter()
    .map(|k| (k.to_string(), url.clone()))
    .collect();
    env.push(("NO_PROXY".into(), String::new()));
    env.push(("no_proxy".into(), String::new()));
    DoorPlan {
        local_cidrs,
        proxy: Some(proxy),
        tcp,
        udp: vec![DNS_DOOR],
        env,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowlist_plan() {
        let p = EgressPolicy::allowlist(
            "jira_search",
            [
                "jira.internal.example:443",
                "api.example.com:443",
                "93.184.216.34:8080",
            ],
        )
        .unwrap();
        let plan = plan(&p);
        assert_eq!(plan.proxy, Some("127.0.0.1:3128".parse().unwrap()));
        assert_eq!(
            plan.tcp,
            vec![
                "127.0.0.1:3128".parse().unwrap(),
                "0.0.0.0:443".parse().unwrap(),
                "0.0.0.0:8080".parse().unwrap()
            ]
        );
        assert_eq!(plan.udp, vec!["127.0.0.1:53".parse().unwrap()]);
        assert_eq!(
            plan.local_cidrs,
            vec![
                "198.18.0.0/15".parse().unwrap(),
                "93.184.216.34/32".parse().unwrap()
            ]
        );
        let env: std::collections::HashMap<_, _> = plan.env.iter().cloned().collect();
        for k in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            assert_eq!(env[k], "http://127.0.0.1:3128", "{k}");
        }
        assert_eq!(env["NO_PROXY"], "");
    }

    #[test]
    fn proxy_mode_plan_and_port_collision() {
        let plan = plan(&EgressPolicy::public_web("browse"));
        assert_eq!(
            plan.tcp,
            vec![
                "127.0.0.1:3128".parse().unwrap(),
                "0.0.0.0:80".parse().unwrap(),
                "0.0.0.0:443".parse().unwrap()
            ]
        );
        let p = EgressPolicy::allowlist("t", ["squid.example:3128", "other.example:3129"]).unwrap();
        let plan = super::plan(&p);
        assert_eq!(plan.proxy, Some("127.0.0.1:3130".parse().unwrap()));
        assert_eq!(plan.env[0].1, "http://127.0.0.1:3130");
    }

    #[test]
    fn closed_policy_has_no_doors() {
        assert!(plan(&EgressPolicy::new("t")).is_empty());
    }
}
