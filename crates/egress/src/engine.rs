//! What every door shares: the allowlist check, the broker's own resolver, vetting, connecting,
//! the DNS door's answers (which address it answered for which name, until when) and its
//! address book (198.18.0.0/15), the address-to-name mapping of the transparent door, the
//! connection limit and event reporting.

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

use crate::event::{Decision, Door, EgressEvent, EventSink, clean};
use crate::interception::Interception;
use crate::name::{Host, normalize_host};
use crate::peek::{Presented, presented};
use crate::plan::DOOR_RANGE;
use crate::policy::{EgressPolicy, HostPattern};
use crate::vet::vet;
use crate::{DoorContext, EgressError, LocalAddresses};

/// How long the transparent door waits for a connection's first bytes (a ClientHello, an HTTP
/// request head) before deciding without them.
const PEEK_WAIT: Duration = Duration::from_secs(1);

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
    pub(crate) answers: Answers,
    /// Makes an answered address local in the sandbox; `None`: the DNS door answers from the
    /// address book instead.
    pub(crate) local: Option<Arc<dyn LocalAddresses>>,
    conns: Arc<Semaphore>,
    /// Set when the sandbox has secrets delivered by the proxy.
    pub(crate) icpt: Option<Arc<Interception>>,
}

/// Where a connection accepted on a transparent door goes.
#[derive(Debug)]
pub(crate) struct Dialled {
    /// The name (or allowlisted IP literal) it is for.
    pub(crate) host: Host,
    /// The address to connect to, vetted when the DNS door answered it; `None`: resolve `host`
    /// (an address from the book, an IP literal).
    pub(crate) to: Option<IpAddr>,
}

/// Why a transparent connection has no destination: (label, reason, address).
pub(crate) type NotDialled = (String, String, Option<IpAddr>);

impl Engine {
    #[cfg(test)]
    pub(crate) fn new(
        policy: Arc<EgressPolicy>,
        ctx: DoorContext,
        events: EventSink,
        local: Option<Arc<dyn LocalAddresses>>,
    ) -> Result<Arc<Self>, EgressError> {
        Self::with(policy, ctx, events, local, None)
    }

    pub(crate) fn with(
        policy: Arc<EgressPolicy>,
        ctx: DoorContext,
        events: EventSink,
        local: Option<Arc<dyn LocalAddresses>>,
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
            answers: Answers::new(BOOK_CAPACITY),
            local,
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
        let addrs = self.resolve_vetted(host, deadline).await?;
        self.connect_any(host, addrs, port, deadline).await
    }

    /// Connect to `to`, an address the DNS door answered for `host` (vetted again, no lookup).
    /// Call only after [`Engine::check`] allowed the destination.
    pub(crate) async fn open_to(
        &self,
        host: &Host,
        to: IpAddr,
        port: u16,
    ) -> Result<(TcpStream, IpAddr), OpenError> {
        let deadline = Instant::now() + self.policy.connect_timeout;
        self.vet_all(host, &[to])?;
        self.connect_any(host, vec![to], port, deadline).await
    }

    /// The addresses of `host` (pin or the broker's own DNS), every one vetted.
    pub(crate) async fn resolve_vetted(
        &self,
        host: &Host,
        deadline: Instant,
    ) -> Result<Vec<IpAddr>, OpenError> {
        let addrs: Vec<IpAddr> = match host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(n) => match self.pins.get(n) {
                Some(ip) => vec![*ip],
                None => self.lookup(n, deadline).await?,
            },
        };
        self.vet_all(host, &addrs)?;
        Ok(addrs)
    }

    fn vet_all(&self, host: &Host, addrs: &[IpAddr]) -> Result<(), OpenError> {
        for a in addrs {
            if let Err(class) = vet(*a, &self.policy.allow_cidrs) {
                let why = match host {
                    Host::Name(n) => format!("{n} resolves to {a}, {class}, not in allow_cidrs"),
                    Host::Ip(_) => format!("{a} is {class}, not in allow_cidrs"),
                };
                return Err(OpenError::Refused { why, address: *a });
            }
        }
        Ok(())
    }

    async fn connect_any(
        &self,
        host: &Host,
        addrs: Vec<IpAddr>,
        port: u16,
        deadline: Instant,
    ) -> Result<(TcpStream, IpAddr), OpenError> {
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

    /// What a connection accepted on a transparent door with local address `ip` is for: the
    /// name the DNS door answered that address for (chosen by the TLS server name or HTTP
    /// `Host` the connection presents, which must be one of them), the name behind an address
    /// of the book, or an allowlisted IP literal.
    pub(crate) async fn dialled(
        &self,
        client: &TcpStream,
        ip: IpAddr,
    ) -> Result<Dialled, NotDialled> {
        let ip = ip.to_canonical();
        let not_ours = |ip: IpAddr| {
            (
                ip.to_string(),
                format!(
                    "{ip} is not an address the DNS door handed out to {}",
                    self.policy.tool
                ),
                Some(ip),
            )
        };
        let (names, to) = match ip {
            IpAddr::V4(a) if DOOR_RANGE.contains(&a) => match self.book.name_of(a) {
                Some(n) => (vec![n], None),
                None => return Err(not_ours(ip)),
            },
            _ => {
                let names = match ip {
                    IpAddr::V4(a) => self.answers.names(a),
                    IpAddr::V6(_) => Vec::new(),
                };
                if names.is_empty() {
                    let listed = self
                        .policy
                        .allow
                        .iter()
                        .any(|hp| hp.host == HostPattern::Ip(ip));
                    return if listed {
                        Ok(Dialled {
                            host: Host::Ip(ip),
                            to: None,
                        })
                    } else {
                        Err(not_ours(ip))
                    };
                }
                (names, Some(ip))
            }
        };
        let label = names.join(" or ");
        let pick = |presented: Option<String>, what: &str| -> Result<String, NotDialled> {
            let Some(raw) = presented else {
                return Err((
                    label.clone(),
                    format!("{what} without a name, to {ip} (answered for {label})"),
                    Some(ip),
                ));
            };
            match normalize_host(&raw) {
                Ok(Host::Name(n)) if names.contains(&n) => Ok(n),
                Ok(h) => Err((
                    label.clone(),
                    format!("{what} names {h}, but {ip} was answered for {label}"),
                    Some(ip),
                )),
                Err(e) => Err((
                    label.clone(),
                    format!("{what} names an invalid host: {e}"),
                    Some(ip),
                )),
            }
        };
        let name = match presented(client, PEEK_WAIT).await {
            Presented::Tls(sni) => pick(sni, "TLS ClientHello")?,
            Presented::Http(host) => pick(host, "HTTP request")?,
            Presented::Other if names.len() == 1 => names[0].clone(),
            Presented::Other => {
                return Err((
                    label.clone(),
                    format!(
                        "{ip} was answered for {label}, and the connection names none of them (no TLS server name, no HTTP Host)"
                    ),
                    Some(ip),
                ));
            }
        };
        Ok(Dialled {
            host: Host::Name(name),
            to,
        })
    }

    /// A label for events about a transparent connection to `ip` (no peeking).
    pub(crate) fn label_of(&self, ip: IpAddr) -> (String, Option<IpAddr>) {
        let ip = ip.to_canonical();
        match ip {
            IpAddr::V4(a) if DOOR_RANGE.contains(&a) => match self.book.name_of(a) {
                Some(n) => (n, None),
                None => (ip.to_string(), Some(ip)),
            },
            IpAddr::V4(a) => {
                let names = self.answers.names(a);
                if names.is_empty() {
                    (ip.to_string(), Some(ip))
                } else {
                    (names.join(" or "), Some(ip))
                }
            }
            IpAddr::V6(_) => (ip.to_string(), Some(ip)),
        }
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
            reflected: Vec::new(),
            exfiltration: match decision {
                Decision::Refused => self.secret_in_name(name),
                Decision::Allowed => None,
            },
        }
    }
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

/// What the DNS door answered, per sandbox: address -> the names it was answered for, each
/// until its answer's lifetime ends. A transparent connection to an address is allowed only for
/// a name that is here and not expired.
pub(crate) struct Answers {
    inner: Mutex<HashMap<Ipv4Addr, Vec<(String, Instant)>>>,
    capacity: usize,
}

impl Answers {
    fn new(capacity: usize) -> Self {
        Answers {
            inner: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ipv4Addr, Vec<(String, Instant)>>> {
        // Every update leaves the map consistent (one insert or retain at a time).
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record that `a` was answered for `name` until `until`; `false` when the table is full
    /// (even after dropping expired answers).
    pub(crate) fn record(&self, a: Ipv4Addr, name: &str, until: Instant) -> bool {
        let mut g = self.lock();
        if !g.contains_key(&a) && g.len() >= self.capacity {
            let now = Instant::now();
            g.retain(|_, v| {
                v.retain(|(_, t)| *t > now);
                !v.is_empty()
            });
            if g.len() >= self.capacity {
                return false;
            }
        }
        let v = g.entry(a).or_default();
        match v.iter_mut().find(|(n, _)| n == name) {
            Some(e) => e.1 = e.1.max(until),
            None => v.push((name.to_string(), until)),
        }
        true
    }

    /// The names `a` was answered for whose answers are still alive, sorted.
    pub(crate) fn names(&self, a: Ipv4Addr) -> Vec<String> {
        let now = Instant::now();
        let g = self.lock();
        let mut v: Vec<String> = g
            .get(&a)
            .map(|v| {
                v.iter()
                    .filter(|(_, t)| *t > now)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::refusal;

    fn engine(p: EgressPolicy) -> Arc<Engine> {
        Engine::new(
            Arc::new(p),
            DoorContext {
                tool: "t".into(),
                session: "s".into(),
            },
            EventSink::discard(),
            None,
        )
        .unwrap()
    }

    #[test]
    fn answers_expire_and_list_every_name() {
        let t = Answers::new(2);
        let a = Ipv4Addr::new(93, 184, 216, 34);
        let later = Instant::now() + Duration::from_secs(60);
        assert!(t.record(a, "b.example", later));
        assert!(t.record(a, "a.example", later));
        assert_eq!(t.names(a), vec!["a.example", "b.example"]);
        // An expired answer no longer counts.
        let b = Ipv4Addr::new(1, 1, 1, 1);
        assert!(t.record(b, "c.example", Instant::now()));
        assert!(t.names(b).is_empty());
        // Full: a third address only once an expired one is dropped.
        assert!(t.record(Ipv4Addr::new(8, 8, 8, 8), "d.example", later));
        assert!(!t.record(Ipv4Addr::new(9, 9, 9, 9), "e.example", later));
        assert!(t.names(Ipv4Addr::new(9, 9, 9, 9)).is_empty());
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
