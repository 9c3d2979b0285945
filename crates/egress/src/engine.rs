//! What every door shares: the allowlist check, the broker's own resolver, vetting, connecting,
//! the address book of the DNS door, the connection limit and event reporting.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::event::{Decision, Door, EgressEvent, EventSink, now_rfc3339};
use crate::intercept::Interception;
use crate::name::{Host, normalize_host};
use crate::plan::DOOR_RANGE;
use crate::policy::EgressPolicy;
use crate::vet::vet;
use crate::{DoorContext, EgressError};

/// Most names one sandbox can get addresses for from the DNS door.
pub(crate) const BOOK_CAPACITY: usize = 65_536;

/// The outcome of the allowlist check.
pub(crate) type Check = Result<String, String>;

/// Why an allowed destination could not be opened.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Vetting refused an address.
    Refused { why: String, address: IpAddr },
    /// Lookup or connect failed.
    Failed {
        why: String,
        address: Option<IpAddr>,
    },
}

/// Per-sandbox state shared by all doors.
pub(crate) struct Engine {
    pub(crate) policy: Arc<EgressPolicy>,
    pub(crate) ctx: DoorContext,
    pub(crate) events: EventSink,
    pins: HashMap<String, IpAddr>,
    resolver: Option<TokioResolver>,
    resolver_error: String,
    pub(crate) book: AddressBook,
    conns: Arc<Semaphore>,
    /// Set when the sandbox has secrets delivered by the proxy.
    pub(crate) icpt: Option<Arc<Interception>>,
}

impl Engine {
    #[cfg(test)]
    pub(crate) fn new(
        policy: Arc<EgressPolicy>,
        ctx: DoorContext,
        events: EventSink,
    ) -> Result<Arc<Self>, EgressError> {
        Self::with(policy, ctx, events, None)
    }

    pub(crate) fn with(
        policy: Arc<EgressPolicy>,
        ctx: DoorContext,
        events: EventSink,
        icpt: Option<Interception>,
    ) -> Result<Arc<Self>, EgressError> {
        policy.validate()?;
        let mut pins = HashMap::new();
        for (name, ip) in &policy.resolve {
            if let Ok(Host::Name(n)) = normalize_host(name) {
                pins.insert(n, *ip);
            }
        }
        let (resolver, resolver_error) = match build_resolver(&policy) {
            Ok(r) => (Some(r), String::new()),
            Err(e) => (None, e),
        };
        Ok(Arc::new(Engine {
            conns: Arc::new(Semaphore::new(policy.max_connections)),
            policy,
            ctx,
            events,
            pins,
            resolver,
            resolver_error,
            book: AddressBook::new(BOOK_CAPACITY),
            icpt: icpt.map(Arc::new),
        }))
    }

    /// The secret whose placeholder is in `name` (as written, or with its
    /// dots left out: split across labels), when the sandbox has injections.
    fn secret_in_name(&self, name: &str) -> Option<String> {
        let needles = self.icpt.as_ref()?.needles();
        needles
            .find(name.as_bytes())
            .or_else(|| needles.find(name.replace('.', "").as_bytes()))
    }

    /// A name carrying a placeholder is never looked up nor connected to
    /// (a lookup alone would carry it to the name's authoritative server).
    fn placeholder_in_name(&self, host: &Host) -> Option<String> {
        let Host::Name(n) = host else {
            return None;
        };
        let secret = self.secret_in_name(n)?;
        Some(format!(
            "the name carries the placeholder of secret {secret}: refused as an exfiltration attempt"
        ))
    }

    /// The interception for connections to `host:port`: `None` without
    /// secrets delivered by the proxy, or for a `passthrough` destination.
    pub(crate) fn interception(&self, host: &Host, port: u16) -> Option<Arc<Interception>> {
        let i = self.icpt.as_ref()?;
        if self
            .policy
            .passthrough
            .iter()
            .any(|hp| hp.port == port && hp.host.matches(host))
        {
            return None;
        }
        Some(i.clone())
    }

    /// Take a connection slot, or `None` when the sandbox is at its limit.
    pub(crate) fn try_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.conns.clone().try_acquire_owned().ok()
    }

    pub(crate) fn limit_reason(&self) -> String {
        format!(
            "connection limit of {} reached for {}",
            self.policy.max_connections, self.policy.tool
        )
    }

    /// The allowlist check on a normalised host and port: `Ok(why allowed)` or
    /// `Err(why refused)`. `raw` is the host as the tool wrote it, for messages.
    pub(crate) fn check(&self, host: &Host, raw: &str, port: u16) -> Check {
        if let Some(why) = self.placeholder_in_name(host) {
            return Err(why);
        }
        let p = &self.policy;
        match host {
            Host::Ip(ip) => {
                if !p.any_public_web
                    && p.allow
                        .iter()
                        .any(|hp| hp.port == port && hp.host.matches(host))
                {
                    return Ok(format!("{host}:{port} is in the allowlist of {}", p.tool));
                }
                let literal = clean(raw);
                if literal == ip.to_string() || literal == host.to_string() {
                    Err(format!(
                        "IP literal {literal} is not in the allowlist of {}",
                        p.tool
                    ))
                } else {
                    Err(format!(
                        "{literal} is an IP literal ({ip}) and is not in the allowlist of {}",
                        p.tool
                    ))
                }
            }
            Host::Name(n) => {
                if p.any_public_web {
                    if is_local_name(n) {
                        return Err(format!("{n} is a loopback name"));
                    }
                    if port != 80 && port != 443 {
                        return Err(format!(
                            "port {port} is not open for {} (proxy mode allows ports 80 and 443)",
                            p.tool
                        ));
                    }
                    return Ok(format!("public web (proxy mode of {})", p.tool));
                }
                match p
                    .allow
                    .iter()
                    .find(|hp| hp.port == port && hp.host.matches(host))
                {
                    Some(hp) => Ok(format!("matches {hp} in the allowlist of {}", p.tool)),
                    None => Err(format!("not in the allowlist of {}", p.tool)),
                }
            }
        }
    }

    /// May the DNS door hand out an address for this name (on some port)?
    pub(crate) fn name_allowed(&self, host: &Host) -> Check {
        if let Some(why) = self.placeholder_in_name(host) {
            return Err(why);
        }
        let p = &self.policy;
        match host {
            Host::Ip(_) => Err("an IP literal is not a name".to_string()),
            Host::Name(n) => {
                if p.any_public_web {
                    if is_local_name(n) {
                        return Err(format!("{n} is a loopback name"));
                    }
                    return Ok(format!("public web (proxy mode of {})", p.tool));
                }
                match p.allow.iter().find(|hp| hp.host.matches(host)) {
                    Some(hp) => Ok(format!("matches {hp} in the allowlist of {}", p.tool)),
                    None => Err(format!("not in the allowlist of {}", p.tool)),
                }
            }
        }
    }

    /// Resolve (pin or the broker's own DNS), vet every address, connect to a vetted one. Call
    /// only after [`Engine::check`] allowed the destination.
    pub(crate) async fn open(
        &self,
        host: &Host,
        port: u16,
    ) -> Result<(TcpStream, IpAddr), OpenError> {
        let deadline = Instant::now() + self.policy.connect_timeout;
        let addrs: Vec<IpAddr> = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(n) => match self.pins.get(n) {
                Some(ip) => vec![*ip],
                None => self.lookup(n, deadline).await?,
            },
        };
        for a in &addrs {
            if let Err(class) = vet(*a, &self.policy.allow_cidrs) {
                let why = match host {
                    Host::Name(n) => format!("{n} resolves to {a}, {class}, not in allow_cidrs"),
                    Host::Ip(_) => format!("{a} is {class}, not in allow_cidrs"),
                };
                return Err(OpenError::Refused { why, address: *a });
            }
        }
        let mut last = OpenError::Failed {
            why: format!("{host} has no address"),
            address: None,
        };
        for a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            let sa = SocketAddr::new(a, port);
            match tokio::time::timeout(left, TcpStream::connect(sa)).await {
                Ok(Ok(s)) => {
                    // Latency of small requests matters more than segment count here.
                    let _ = s.set_nodelay(true);
                    return Ok((s, a));
                }
                Ok(Err(e)) => {
                    last = OpenError::Failed {
                        why: format!("connect to {sa} failed: {e}"),
                        address: Some(a),
                    }
                }
                Err(_) => {
                    return Err(OpenError::Failed {
                        why: format!(
                            "connect to {sa} timed out after {} ms",
                            self.policy.connect_timeout.as_millis()
                        ),
                        address: Some(a),
                    });
                }
            }
        }
        Err(last)
    }

    async fn lookup(&self, name: &str, deadline: Instant) -> Result<Vec<IpAddr>, OpenError> {
        let Some(r) = &self.resolver else {
            return Err(OpenError::Failed {
                why: format!("cannot resolve {name}: {}", self.resolver_error),
                address: None,
            });
        };
        // The trailing dot makes the name fully qualified: no search list, one query set.
        let fqdn = format!("{name}.");
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, r.lookup_ip(fqdn.as_str())).await {
            Ok(Ok(lookup)) => {
                let v: Vec<IpAddr> = lookup.iter().collect();
                if v.is_empty() {
                    Err(OpenError::Failed {
                        why: format!("{name} has no address"),
                        address: None,
                    })
                } else {
                    Ok(v)
                }
            }
            Ok(Err(e)) => Err(OpenError::Failed {
                why: format!("lookup of {name} failed: {e}"),
                address: None,
            }),
            Err(_) => Err(OpenError::Failed {
                why: format!(
                    "lookup of {name} timed out after {} ms",
                    self.policy.connect_timeout.as_millis()
                ),
                address: None,
            }),
        }
    }

    /// Report one attempt.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn emit(
        &self,
        door: Door,
        name: &str,
        port: u16,
        address: Option<IpAddr>,
        decision: Decision,
        reason: String,
        bytes: (u64, u64),
        started: (Instant, String),
    ) {
        let e = self.event(door, name, port, address, decision, reason, bytes, started);
        self.events.emit(e);
    }

    /// The event of one attempt, to be completed and emitted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn event(
        &self,
        door: Door,
        name: &str,
        port: u16,
        address: Option<IpAddr>,
        decision: Decision,
        reason: String,
        bytes: (u64, u64),
        started: (Instant, String),
    ) -> EgressEvent {
        EgressEvent {
            tool: self.ctx.tool.clone(),
            session: self.ctx.session.clone(),
            name: name.to_string(),
            port,
            address,
            door,
            decision,
            reason,
            bytes_up: bytes.0,
            bytes_down: bytes.1,
            duration_ms: u64::try_from(started.0.elapsed().as_millis()).unwrap_or(u64::MAX),
            time: started.1,
            injected: Vec::new(),
            exfiltration: match decision {
                Decision::Refused => self.secret_in_name(name),
                Decision::Allowed => None,
            },
        }
    }
}

/// Start of an attempt, for the event's `duration_ms` and `time`.
pub(crate) fn started() -> (Instant, String) {
    (Instant::now(), now_rfc3339())
}

/// The refusal text: the tool sees it (403 body) and the event carries it.
pub(crate) fn refusal(target: &str, port: u16, why: &str) -> String {
    format!("egress to {}:{port} refused: {why}", clean(target))
}

/// Make tool-supplied text safe for one log line: printable ASCII only, bounded length.
pub(crate) fn clean(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(256)
        .collect();
    if s.chars().count() > 256 {
        out.push_str("...");
    }
    out
}

fn is_local_name(n: &str) -> bool {
    n == "localhost"
        || n.ends_with(".localhost")
        || n == "localhost.localdomain"
        || n == "ip6-localhost"
        || n == "ip6-loopback"
}

fn build_resolver(policy: &EgressPolicy) -> Result<TokioResolver, String> {
    let (config, _) = match policy.upstream_dns {
        Some(sa) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = sa.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = sa.port();
            (
                ResolverConfig::from_name_servers(vec![NameServerConfig::new(
                    sa.ip(),
                    true,
                    vec![udp, tcp],
                )]),
                (),
            )
        }
        None => {
            let (c, _opts) = hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| format!("no upstream DNS configured and /etc/resolv.conf: {e}"))?;
            (c, ())
        }
    };
    let mut b = TokioResolver::builder_with_config(config, TokioRuntimeProvider::default());
    let opts = b.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4thenIpv6;
    opts.use_hosts_file = ResolveHosts::Never;
    opts.timeout = policy.connect_timeout.min(Duration::from_secs(5));
    opts.attempts = 1;
    opts.ndots = 0;
    b.build()
        .map_err(|e| format!("cannot build the DNS resolver: {e}"))
}

/// Addresses the DNS door handed out, per sandbox: name <-> 198.18.0.0/15.
pub(crate) struct AddressBook {
    inner: Mutex<BookInner>,
    capacity: usize,
}

struct BookInner {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    next: u32,
}

impl AddressBook {
    fn new(capacity: usize) -> Self {
        AddressBook {
            inner: Mutex::new(BookInner {
                by_name: HashMap::new(),
                by_addr: HashMap::new(),
                next: 1,
            }),
            capacity: capacity.min((1usize << (32 - DOOR_RANGE.prefix_len())) - 2),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BookInner> {
        // The maps stay consistent even if a holder panicked: every update is two inserts of
        // values computed before the lock.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The address for `name`, allocating one on first use; `None` when the book is full.
    pub(crate) fn assign(&self, name: &str) -> Option<Ipv4Addr> {
        let mut g = self.lock();
        if let Some(a) = g.by_name.get(name) {
            return Some(*a);
        }
        if g.by_name.len() >= self.capacity {
            return None;
        }
        let a = Ipv4Addr::from(u32::from(DOOR_RANGE.network()) + g.next);
        g.next += 1;
        g.by_name.insert(name.to_string(), a);
        g.by_addr.insert(a, name.to_string());
        Some(a)
    }

    /// The name an address was handed out for.
    pub(crate) fn name_of(&self, a: Ipv4Addr) -> Option<String> {
        self.lock().by_addr.get(&a).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(p: EgressPolicy) -> Arc<Engine> {
        Engine::new(
            Arc::new(p),
            DoorContext {
                tool: "t".into(),
                session: "s".into(),
            },
            EventSink::discard(),
        )
        .unwrap()
    }

    #[test]
    fn book_is_stable_and_bounded() {
        let b = AddressBook::new(2);
        let a1 = b.assign("a.example").unwrap();
        assert_eq!(a1, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(b.assign("a.example"), Some(a1));
        let a2 = b.assign("b.example").unwrap();
        assert_eq!(a2, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(b.assign("c.example"), None);
        assert_eq!(b.name_of(a2).as_deref(), Some("b.example"));
        assert_eq!(b.name_of(Ipv4Addr::new(198, 18, 0, 3)), None);
    }

    #[tokio::test]
    async fn check_table() {
        let mut p = EgressPolicy::allowlist(
            "jira_search",
            [
                "jira.internal.example:443",
                "*.cdn.example:443",
                "93.184.216.34:80",
            ],
        )
        .unwrap();
        p.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
        let e = engine(p);
        let c = |raw: &str, port| {
            let h = normalize_host(raw).unwrap();
            e.check(&h, raw, port)
        };
        assert!(c("jira.internal.example", 443).is_ok());
        assert!(c("JIRA.internal.example.", 443).is_ok());
        assert!(c("a.cdn.example", 443).is_ok());
        assert_eq!(
            c("cdn.example", 443),
            Err("not in the allowlist of jira_search".into())
        );
        assert_eq!(
            c("jira.internal.example", 80),
            Err("not in the allowlist of jira_search".into())
        );
        assert_eq!(
            c("evil.example", 443),
            Err("not in the allowlist of jira_search".into())
        );
        assert!(c("93.184.216.34", 80).is_ok());
        assert!(c("0x5db8d822", 80).is_ok());
        assert_eq!(
            c("93.184.216.34", 443),
            Err("IP literal 93.184.216.34 is not in the allowlist of jira_search".into())
        );
        assert_eq!(
            c("2852039166", 80),
            Err(
                "2852039166 is an IP literal (169.254.169.254) and is not in the allowlist of jira_search"
                    .into()
            )
        );
        assert_eq!(
            refusal("evil.example", 443, "not in the allowlist of jira_search"),
            "egress to evil.example:443 refused: not in the allowlist of jira_search"
        );
    }

    #[tokio::test]
    async fn proxy_mode_check() {
        let mut p = EgressPolicy::public_web("browse");
        p.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
        let e = engine(p);
        let h = |s: &str| normalize_host(s).unwrap();
        assert!(e.check(&h("example.com"), "example.com", 443).is_ok());
        assert!(e.check(&h("example.com"), "example.com", 80).is_ok());
        assert!(e.check(&h("example.com"), "example.com", 22).is_err());
        assert_eq!(
            e.check(&h("localhost"), "localhost", 80),
            Err("localhost is a loopback name".into())
        );
        assert!(e.check(&h("a.localhost"), "a.localhost", 80).is_err());
        assert!(e.check(&h("1.1.1.1"), "1.1.1.1", 443).is_err());
        assert!(e.name_allowed(&h("example.com")).is_ok());
        assert!(e.name_allowed(&h("localhost")).is_err());
    }

    #[tokio::test]
    async fn vetting_refuses_pinned_private_and_allows_listed_cidr() {
        let mut p = EgressPolicy::allowlist("t", ["a.example:80", "b.example:80"]).unwrap();
        p.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
        p.resolve
            .insert("a.example".into(), "10.0.0.1".parse().unwrap());
        p.resolve
            .insert("b.example".into(), "127.0.0.1".parse().unwrap());
        p.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
        let e = engine(p);
        match e.open(&Host::Name("a.example".into()), 80).await {
            Err(OpenError::Refused { why, address }) => {
                assert_eq!(
                    why,
                    "a.example resolves to 10.0.0.1, a private address (RFC 1918), not in allow_cidrs"
                );
                assert_eq!(address, "10.0.0.1".parse::<IpAddr>().unwrap());
            }
            other => panic!("expected a vetting refusal, got {other:?}"),
        }
        // Positive control: the pinned loopback address is in allow_cidrs, so vetting passes and
        // the connect itself is attempted (and fails: nothing listens on port 80 here, or if
        // something does, it succeeds).
        let r = e.open(&Host::Name("b.example".into()), 80).await;
        assert!(
            !matches!(r, Err(OpenError::Refused { .. })),
            "b.example must pass vetting: {r:?}"
        );
    }
}
