//! Network probes: can the sandbox reach anything beyond itself?
//!
//! Rules for reading a dial:
//! - connected: escaped;
//! - ECONNREFUSED from a non-loopback address: escaped (a host answered, so
//!   a route exists);
//! - ECONNREFUSED from a loopback address: held (the sandbox's own
//!   loopback answered; its own network namespace is not an escape);
//! - any other refusal (ENETUNREACH, EPERM, EACCES...) or no answer within
//!   the timeout: held.

use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use nix::errno::Errno;

use super::{Finding, Opts, Verdict, errname, errno_of};

const DEFAULT_TIMEOUT_MS: u64 = 2000;

fn timeout(opts: &Opts) -> Result<Duration, String> {
    opts.num("timeout-ms", DEFAULT_TIMEOUT_MS)
        .map(Duration::from_millis)
}

fn target(opts: &Opts, default: &str) -> Result<SocketAddr, String> {
    let t = opts.get("target").unwrap_or(default);
    t.parse()
        .map_err(|_| format!("--target {t:?} is not an address:port"))
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_loopback(),
        IpAddr::V6(a) => a.is_loopback() || a.to_ipv4_mapped().is_some_and(|v| v.is_loopback()),
    }
}

/// Whether `ip` is an address of the sandbox's own network namespace (so a
/// refusal from it came from the sandbox's own stack). Binding to an
/// address succeeds only when it is local; when the bind itself is refused
/// the answer is "not local", the conservative reading.
fn is_local(ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4),
        v4 => v4,
    };
    is_loopback(ip) || UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// Dial `addr` over TCP; `label` is how the address was written.
fn dial(label: &str, addr: SocketAddr, t: Duration) -> Finding {
    let shown = if label == addr.to_string() {
        label.to_string()
    } else {
        format!("{label} (= {addr})")
    };
    match TcpStream::connect_timeout(&addr, t) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
            let mut buf = [0u8; 64];
            let banner = match s.read(&mut buf) {
                Ok(n) if n > 0 => {
                    format!(", read {:?}", String::from_utf8_lossy(&buf[..n]).trim_end())
                }
                _ => String::new(),
            };
            Finding::escaped(format!("connect {shown}: connected{banner}"))
        }
        Err(e) if errno_of(&e) == Some(Errno::ECONNREFUSED) => {
            if is_loopback(addr.ip()) {
                Finding::held(format!(
                    "connect {shown}: ECONNREFUSED (the sandbox's own loopback)"
                ))
            } else if is_local(addr.ip()) {
                Finding::held(format!(
                    "connect {shown}: ECONNREFUSED (an address of the sandbox's own namespace)"
                ))
            } else {
                Finding::escaped(format!(
                    "connect {shown}: ECONNREFUSED (a host answered: a route exists)"
                ))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::TimedOut && e.raw_os_error().is_none() => {
            Finding::held(format!(
                "connect {shown}: no answer within {} ms",
                t.as_millis()
            ))
        }
        Err(e) => Finding::held(format!("connect {shown}: {}", errname(&e))),
    }
}

/// TCP connect to the outside target (default 1.1.1.1:443).
pub(super) fn network(opts: &Opts) -> Verdict {
    run(|| {
        let a = target(opts, "1.1.1.1:443")?;
        Ok(Verdict::combine(vec![dial(
            &a.to_string(),
            a,
            timeout(opts)?,
        )]))
    })
}

/// Another port on the same host as an allowlisted address.
pub(crate) fn other_port(port: u16) -> u16 {
    if port == 22 { 23 } else { 22 }
}

/// For a tool granted egress to `--allow a:p,b:q`: each allowlisted
/// address must connect (else the grant is broken and the result is an
/// error), and the same hosts on another port must not (escaped when a
/// connect, or a refusal from a non-loopback host, shows the packet got
/// there).
pub(super) fn egress(opts: &Opts) -> Verdict {
    run(|| {
        let t = timeout(opts)?;
        let list = opts.get("allow").unwrap_or("");
        let allowed: Vec<SocketAddr> = list
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse()
                    .map_err(|_| format!("--allow {s:?} is not an address:port"))
            })
            .collect::<Result<_, _>>()?;
        if allowed.is_empty() {
            return Ok(Verdict::skipped("no egress granted (--allow)"));
        }
        let mut f = Vec::new();
        for a in &allowed {
            // The grant works only if the connection is accepted; a refusal
            // means the route exists but nothing serves the allowlisted port.
            f.push(match TcpStream::connect_timeout(a, t) {
                Ok(_) => Finding::held(format!("allowlisted {a}: connected")),
                Err(e) => Finding::error(format!(
                    "allowlisted {a} is not reachable ({}): the grant does not work",
                    if e.raw_os_error().is_some() {
                        errname(&e)
                    } else {
                        format!("no answer within {} ms", t.as_millis())
                    }
                )),
            });
            let other = SocketAddr::new(a.ip(), other_port(a.port()));
            if !allowed.contains(&other) {
                f.push(dial(&format!("{other} (not allowlisted)"), other, t));
            }
        }
        Ok(Verdict::combine(f))
    })
}

/// TCP connect to a private-range target (default 10.0.0.1:80).
pub(super) fn private(opts: &Opts) -> Verdict {
    run(|| {
        let a = target(opts, "10.0.0.1:80")?;
        Ok(Verdict::combine(vec![dial(
            &a.to_string(),
            a,
            timeout(opts)?,
        )]))
    })
}

/// TCP connect to a listener the harness runs on the host's loopback.
pub(super) fn host_loopback(opts: &Opts) -> Verdict {
    if opts.get("target").is_none() {
        return Verdict::skipped("no host loopback listener given (--target)");
    }
    run(|| {
        let a = target(opts, "")?;
        Ok(Verdict::combine(vec![dial(
            &a.to_string(),
            a,
            timeout(opts)?,
        )]))
    })
}

/// Parse an IPv4 literal the way `inet_aton(3)` (and so most resolvers and
/// URL libraries built on it) does: one to four parts, each decimal, octal
/// (leading 0) or hex (0x), the last part filling the remaining bytes.
pub fn parse_inet_aton(s: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut nums = Vec::with_capacity(parts.len());
    for p in &parts {
        let (digits, radix) = if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X"))
        {
            (h, 16)
        } else if p.len() > 1 && p.starts_with('0') {
            (&p[1..], 8)
        } else {
            (*p, 10)
        };
        if digits.is_empty() && radix != 8 {
            return None;
        }
        if !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        let n = if digits.is_empty() {
            0
        } else {
            u64::from_str_radix(digits, radix).ok()?
        };
        nums.push(n);
    }
    let (last, head) = nums.split_last()?;
    if head.iter().any(|&n| n > 0xff) {
        return None;
    }
    let last_bits = 32 - 8 * head.len() as u32;
    if *last >= (1u64 << last_bits) {
        return None;
    }
    let mut v: u64 = 0;
    for (i, &n) in head.iter().enumerate() {
        v |= n << (24 - 8 * i as u32);
    }
    v |= last;
    u32::try_from(v).ok().map(Ipv4Addr::from)
}

/// The literal forms of an IPv4 address that a filter matching strings
/// would miss and a resolver would still dial.
pub(crate) fn v4_literals(a: Ipv4Addr) -> Vec<String> {
    let o = a.octets();
    let n = u32::from(a);
    vec![
        a.to_string(),
        n.to_string(),
        format!("0{:o}.0{:o}.0{:o}.0{:o}", o[0], o[1], o[2], o[3]),
        format!("0x{n:x}"),
        format!("0x{:x}.0x{:x}.0x{:x}.0x{:x}", o[0], o[1], o[2], o[3]),
    ]
}

/// The metadata address (default 169.254.169.254:80) in each literal form,
/// its IPv4-mapped IPv6 form, and an IPv6 metadata address (default
/// [fd00:ec2::254]:80).
pub(super) fn metadata(opts: &Opts) -> Verdict {
    run(|| {
        let t = timeout(opts)?;
        let a = target(opts, "169.254.169.254:80")?;
        let SocketAddr::V4(a4) = a else {
            return Err(format!("--target {a} must be IPv4"));
        };
        let mut findings = Vec::new();
        for lit in v4_literals(*a4.ip()) {
            match parse_inet_aton(&lit) {
                Some(ip) => findings.push(dial(&lit, SocketAddr::from((ip, a4.port())), t)),
                None => findings.push(Finding::error(format!("cannot parse literal {lit}"))),
            }
        }
        let mapped: Ipv6Addr = a4.ip().to_ipv6_mapped();
        findings.push(dial(
            &format!("[::ffff:{}]:{}", a4.ip(), a4.port()),
            SocketAddr::from((mapped, a4.port())),
            t,
        ));
        let v6 = opts.get("v6").unwrap_or("[fd00:ec2::254]:80");
        if v6 != "none" {
            let v6a: SocketAddr = v6
                .parse()
                .map_err(|_| format!("--v6 {v6:?} is not an address:port"))?;
            findings.push(dial(v6, v6a, t));
        }
        Ok(Verdict::combine(findings))
    })
}

/// A DNS query for `cordon-probe.invalid. A IN`.
fn dns_query() -> Vec<u8> {
    let mut q = vec![0x43, 0x44, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["cordon-probe", "invalid"] {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Send one DNS query over UDP and wait for any reply.
fn udp_query(label: &str, addr: SocketAddr, t: Duration) -> Finding {
    let bind = if addr.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let sock = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => return Finding::held(format!("udp {label}: socket/bind: {}", errname(&e))),
    };
    if let Err(e) = sock.connect(addr) {
        return Finding::held(format!("udp {label} {addr}: connect: {}", errname(&e)));
    }
    if let Err(e) = sock.send(&dns_query()) {
        return Finding::held(format!("udp {label} {addr}: send: {}", errname(&e)));
    }
    let _ = sock.set_read_timeout(Some(t));
    let mut buf = [0u8; 512];
    match sock.recv(&mut buf) {
        Ok(n) => Finding::escaped(format!("dns {label} {addr}: {n}-byte reply")),
        Err(e) if errno_of(&e) == Some(Errno::ECONNREFUSED) => {
            if is_loopback(addr.ip()) {
                Finding::held(format!(
                    "dns {label} {addr}: ECONNREFUSED (the sandbox's own loopback)"
                ))
            } else if is_local(addr.ip()) {
                Finding::held(format!(
                    "dns {label} {addr}: ECONNREFUSED (an address of the sandbox's own namespace)"
                ))
            } else {
                Finding::escaped(format!(
                    "dns {label} {addr}: ECONNREFUSED (a host answered: a route exists)"
                ))
            }
        }
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            Finding::held(format!(
                "dns {label} {addr}: query sent, no reply within {} ms",
                t.as_millis()
            ))
        }
        Err(e) => Finding::held(format!("dns {label} {addr}: recv: {}", errname(&e))),
    }
}

/// Nameservers listed in a resolv.conf text.
pub(crate) fn resolv_nameservers(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("nameserver"))
                .then(|| w.next())
                .flatten()
                .and_then(|a| a.split('%').next())
                .and_then(|a| a.parse().ok())
        })
        .collect()
}

/// UDP DNS to the resolver target (default 1.1.1.1:53) and to every
/// nameserver /etc/resolv.conf lists.
pub(super) fn dns(opts: &Opts) -> Verdict {
    run(|| {
        let t = timeout(opts)?;
        let a = target(opts, "1.1.1.1:53")?;
        let mut findings = vec![udp_query("target", a, t)];
        match std::fs::read_to_string("/etc/resolv.conf") {
            Ok(text) => {
                let ns = resolv_nameservers(&text);
                findings.push(Finding::held(format!(
                    "/etc/resolv.conf present, nameservers {ns:?}"
                )));
                for ip in ns {
                    findings.push(udp_query("resolv.conf", SocketAddr::new(ip, 53), t));
                }
            }
            Err(e) => findings.push(Finding::held(format!("/etc/resolv.conf: {}", errname(&e)))),
        }
        Ok(Verdict::combine(findings))
    })
}

fn run(f: impl FnOnce() -> Result<Verdict, String>) -> Verdict {
    f().unwrap_or_else(Verdict::error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inet_aton_forms_of_the_metadata_address() {
        let md = Ipv4Addr::new(169, 254, 169, 254);
        for lit in v4_literals(md) {
            assert_eq!(parse_inet_aton(&lit), Some(md), "{lit}");
        }
        assert_eq!(parse_inet_aton("2852039166"), Some(md));
        assert_eq!(parse_inet_aton("0251.0376.0251.0376"), Some(md));
        assert_eq!(parse_inet_aton("0xa9fea9fe"), Some(md));
        assert_eq!(parse_inet_aton("169.254.43518"), Some(md));
        assert_eq!(parse_inet_aton("127.1"), Some(Ipv4Addr::new(127, 0, 0, 1)));
        assert_eq!(parse_inet_aton("0"), Some(Ipv4Addr::UNSPECIFIED));
    }

    #[test]
    fn inet_aton_rejects() {
        for bad in [
            "",
            "1.2.3.4.5",
            "256.1.1.1",
            "09",
            "0x",
            "1..2",
            "a.b.c.d",
            "4294967296",
            "1.16777216",
        ] {
            assert_eq!(parse_inet_aton(bad), None, "{bad}");
        }
    }

    #[test]
    fn resolv_conf_parsing() {
        let t = "# x\nnameserver 10.0.0.2\nsearch a\nnameserver fe80::1%eth0\nnameserver\n";
        assert_eq!(
            resolv_nameservers(t),
            vec![
                "10.0.0.2".parse::<IpAddr>().unwrap(),
                "fe80::1".parse::<IpAddr>().unwrap()
            ]
        );
    }

    #[test]
    fn dial_refused_on_loopback_is_held_and_connect_is_escaped() {
        // Positive control on loopback: a listener we own.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap();
        let f = dial(&a.to_string(), a, Duration::from_secs(2));
        assert_eq!(f.kind, super::super::Kind::Escaped, "{}", f.text);
        drop(l);
        let f = dial(&a.to_string(), a, Duration::from_secs(2));
        assert_eq!(f.kind, super::super::Kind::Held, "{}", f.text);
        assert!(f.text.contains("ECONNREFUSED"), "{}", f.text);
    }
}
