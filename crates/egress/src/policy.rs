//! The egress policy of one tool, and the allowlist entries it is made of.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;

use crate::name::{Host, NameError, normalize_host};

/// Default cap on concurrent connections per sandbox.
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Default timeout for resolving and connecting to an upstream.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default idle timeout: a connection with no bytes either way for this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one tool may reach. Built by the policy layer from the manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Tool name, used in refusal messages.
    pub tool: String,
    /// `egress: [host:port, ...]`.
    pub allow: Vec<HostPort>,
    /// `egress: proxy`: any public destination on ports 80 and 443.
    pub any_public_web: bool,
    /// `resolve: {name: ip}` pins: these names are never looked up in DNS.
    pub resolve: BTreeMap<String, IpAddr>,
    /// Non-public ranges the tool may nevertheless reach (an internal API, a test upstream).
    pub allow_cidrs: Vec<IpNet>,
    /// Upstream nameserver for the broker's own lookups; `None` reads `/etc/resolv.conf`.
    pub upstream_dns: Option<SocketAddr>,
    /// Concurrent connections per sandbox, all doors together.
    pub max_connections: usize,
    /// Timeout for resolving plus connecting to an upstream.
    pub connect_timeout: Duration,
    /// Close a connection after this long without a byte either way.
    pub idle_timeout: Duration,
    /// Hosts whose TLS is never intercepted (pinned or mutual TLS): tunnelled
    /// untouched, and no secret is ever substituted on the way there.
    pub passthrough: Vec<HostPort>,
}

impl EgressPolicy {
    /// A policy that allows nothing yet, with the default limits.
    pub fn new(tool: impl Into<String>) -> Self {
        EgressPolicy {
            tool: tool.into(),
            allow: Vec::new(),
            any_public_web: false,
            resolve: BTreeMap::new(),
            allow_cidrs: Vec::new(),
            upstream_dns: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            passthrough: Vec::new(),
        }
    }

    /// `egress: [host:port, ...]`: parses every entry with [`HostPort::parse`].
    pub fn allowlist<I, S>(tool: impl Into<String>, entries: I) -> Result<Self, HostPortError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut p = Self::new(tool);
        for e in entries {
            p.allow.push(HostPort::parse(e.as_ref())?);
        }
        Ok(p)
    }

    /// `egress: proxy`: any public destination on ports 80 and 443.
    pub fn public_web(tool: impl Into<String>) -> Self {
        let mut p = Self::new(tool);
        p.any_public_web = true;
        p
    }

    /// True when the policy allows nothing, so the tool needs no doors at all.
    pub fn is_closed(&self) -> bool {
        self.allow.is_empty() && !self.any_public_web
    }

    /// Check the parts [`HostPort::parse`] cannot: pins, limits.
    pub fn validate(&self) -> Result<(), PolicyError> {
        for (name, ip) in &self.resolve {
            match normalize_host(name) {
                Ok(Host::Name(_)) => {}
                Ok(Host::Ip(_)) => {
                    return Err(PolicyError::PinIsIp { name: name.clone() });
                }
                Err(source) => {
                    return Err(PolicyError::PinName {
                        name: name.clone(),
                        source,
                    });
                }
            }
            let _ = ip;
        }
        if self.max_connections == 0 {
            return Err(PolicyError::Limit("max_connections must be at least 1"));
        }
        if self.connect_timeout.is_zero() {
            return Err(PolicyError::Limit("connect_timeout must be positive"));
        }
        if self.idle_timeout.is_zero() {
            return Err(PolicyError::Limit("idle_timeout must be positive"));
        }
        Ok(())
    }

    /// Ports that get a transparent listener: every allowed port, or 80 and 443 in proxy mode.
    pub fn transparent_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = if self.any_public_web {
            vec![80, 443]
        } else {
            self.allow.iter().map(|hp| hp.port).collect()
        };
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

/// A policy that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A `resolve:` key that is not a valid name.
    #[error("resolve pin `{name}`: {source}")]
    PinName {
        /// The key as written.
        name: String,
        /// Why it is not a name.
        source: NameError,
    },
    /// A `resolve:` key that is an IP literal.
    #[error("resolve pin `{name}` is an IP literal, not a name")]
    PinIsIp {
        /// The key as written.
        name: String,
    },
    /// A limit that makes no sense.
    #[error("invalid limit: {0}")]
    Limit(&'static str),
}

/// The host part of an allowlist entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this normalised name.
    Name(String),
    /// `*.suffix`: any name strictly below `suffix` (not `suffix` itself).
    Wildcard(String),
    /// Exactly this IP literal.
    Ip(IpAddr),
}

impl HostPattern {
    /// Does this pattern cover the normalised `host`?
    pub fn matches(&self, host: &Host) -> bool {
        match (self, host) {
            (HostPattern::Name(n), Host::Name(h)) => n == h,
            (HostPattern::Wildcard(suffix), Host::Name(h)) => h
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (HostPattern::Ip(a), Host::Ip(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Name(n) => f.write_str(n),
            HostPattern::Wildcard(s) => write!(f, "*.{s}"),
            HostPattern::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            HostPattern::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// One allowlist entry, `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Normalised host pattern.
    pub host: HostPattern,
    /// TCP port, 1..=65535.
    pub port: u16,
}

/// Why an allowlist entry does not parse. The message is meant to be shown next to the
/// manifest line it came from.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostPortError {
    /// No `:port` at the end.
    #[error("`{0}`: missing `:port` (write it as host:port, e.g. api.example.com:443)")]
    MissingPort(String),
    /// The port is not a number in 1..=65535.
    #[error("`{entry}`: port `{port}` is not a number from 1 to 65535")]
    BadPort {
        /// The whole entry.
        entry: String,
        /// The port part.
        port: String,
    },
    /// An IPv6 literal without brackets.
    #[error("`{0}`: write an IPv6 address in brackets, e.g. [2001:db8::1]:443")]
    UnbracketedIpv6(String),
    /// A wildcard anywhere but a leading `*.`.
    #[error("`{0}`: a wildcard is only allowed as a leading `*.` label, e.g. *.example.com:443")]
    BadWildcard(String),
    /// A scheme or a path.
    #[error("`{0}`: write only host:port, without a scheme or path")]
    NotHostPort(String),
    /// The host part is not a valid host.
    #[error("`{entry}`: {source}")]
    Host {
        /// The whole entry.
        entry: String,
        /// Why the host is invalid.
        source: NameError,
    },
}

impl HostPort {
    /// Parse `host:port`, `[v6]:port` or `*.suffix:port`, normalising the host.
    pub fn parse(entry: &str) -> Result<HostPort, HostPortError> {
        let s = entry.trim();
        if s.contains("://") || s.contains('/') {
            return Err(HostPortError::NotHostPort(entry.to_string()));
        }
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| HostPortError::MissingPort(entry.to_string()))?;
        if host.contains(':') && !host.starts_with('[') {
            return Err(HostPortError::UnbracketedIpv6(entry.to_string()));
        }
        let port_num: u16 = match port.parse::<u16>() {
            Ok(p) if p != 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
            _ => {
                return Err(HostPortError::BadPort {
                    entry: entry.to_string(),
                    port: port.to_string(),
                });
            }
        };
        let host_err = |source| HostPortError::Host {
            entry: entry.to_string(),
            source,
        };
        let pattern = if let Some(suffix) = host.strip_prefix("*.") {
            if suffix.contains('*') {
                return Err(HostPortError::BadWildcard(entry.to_string()));
            }
            match normalize_host(suffix).map_err(host_err)? {
                Host::Name(n) => HostPattern::Wildcard(n),
                Host::Ip(_) => return Err(HostPortError::BadWildcard(entry.to_string())),
            }
        } else {
            if host.contains('*') {
                return Err(HostPortError::BadWildcard(entry.to_string()));
            }
            match normalize_host(host).map_err(host_err)? {
                Host::Name(n) => HostPattern::Name(n),
                Host::Ip(a) => HostPattern::Ip(a),
            }
        };
        Ok(HostPort {
            host: pattern,
            port: port_num,
        })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl std::str::FromStr for HostPort {
    type Err = HostPortError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        HostPort::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_entries() {
        let ok: &[(&str, &str)] = &[
            ("jira.internal.example:443", "jira.internal.example:443"),
            ("JIRA.Internal.Example.:443", "jira.internal.example:443"),
            ("bücher.example:80", "xn--bcher-kva.example:80"),
            ("*.Example.com:443", "*.example.com:443"),
            ("93.184.216.34:443", "93.184.216.34:443"),
            ("0x5db8d822:443", "93.184.216.34:443"),
            ("[2001:db8::1]:8443", "[2001:db8::1]:8443"),
            ("  api.example.com:443  ", "api.example.com:443"),
        ];
        for (input, want) in ok {
            let hp = HostPort::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(hp.to_string(), *want);
        }
    }

    #[test]
    fn parse_errors_are_specific() {
        use HostPortError as E;
        assert!(matches!(
            HostPort::parse("api.example.com"),
            Err(E::MissingPort(_))
        ));
        assert!(matches!(
            HostPort::parse("api.example.com:0"),
            Err(E::BadPort { .. })
        ));
        assert!(matches!(
            HostPort::parse("api.example.com:65536"),
            Err(E::BadPort { .. })
        ));
        assert!(matches!(
            HostPort::parse("api.example.com:+80"),
            Err(E::BadPort { .. })
        ));
        assert!(matches!(
            HostPort::parse("api.example.com:"),
            Err(E::BadPort { .. })
        ));
        assert!(matches!(
            HostPort::parse("2001:db8::1:443"),
            Err(E::UnbracketedIpv6(_))
        ));
        assert!(matches!(
            HostPort::parse("a.*.example.com:443"),
            Err(E::BadWildcard(_))
        ));
        assert!(matches!(HostPort::parse("*:443"), Err(E::BadWildcard(_))));
        assert!(matches!(
            HostPort::parse("*.1.2.3.4:443"),
            Err(E::BadWildcard(_))
        ));
        assert!(matches!(
            HostPort::parse("https://api.example.com:443"),
            Err(E::NotHostPort(_))
        ));
        assert!(matches!(
            HostPort::parse("user@api.example.com:443"),
            Err(E::Host {
                source: NameError::Userinfo,
                ..
            })
        ));
        assert!(matches!(
            HostPort::parse("exa mple.com:443"),
            Err(E::Host { .. })
        ));
        let msg = HostPort::parse("api.example.com").unwrap_err().to_string();
        assert!(msg.contains("missing `:port`"), "{msg}");
    }

    #[test]
    fn wildcard_matches_subdomains_only() {
        let p = HostPattern::Wildcard("example.com".into());
        assert!(p.matches(&Host::Name("a.example.com".into())));
        assert!(p.matches(&Host::Name("a.b.example.com".into())));
        assert!(!p.matches(&Host::Name("example.com".into())));
        assert!(!p.matches(&Host::Name("badexample.com".into())));
        assert!(!p.matches(&Host::Name(".example.com".into())));
    }

    #[test]
    fn validate_pins_and_limits() {
        let mut p = EgressPolicy::new("t");
        p.resolve
            .insert("api.example.com".into(), "127.0.0.1".parse().unwrap());
        assert!(p.validate().is_ok());
        p.resolve
            .insert("10.0.0.1".into(), "127.0.0.1".parse().unwrap());
        assert!(matches!(p.validate(), Err(PolicyError::PinIsIp { .. })));
        let mut p = EgressPolicy::new("t");
        p.max_connections = 0;
        assert!(matches!(p.validate(), Err(PolicyError::Limit(_))));
    }
}
