//! Vetting of the addresses a name resolves to: only public unicast destinations pass, unless
//! the policy's `allow_cidrs` names the address explicitly.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// Why an address is not a public destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forbidden {
    /// 0.0.0.0/8 ("this network"), `::`.
    Unspecified,
    /// 127.0.0.0/8, `::1`.
    Loopback,
    /// RFC 1918: 10/8, 172.16/12, 192.168/16.
    Private,
    /// 169.254/16 (including cloud metadata 169.254.169.254), fe80::/10.
    LinkLocal,
    /// 100.64/10.
    Cgnat,
    /// fc00::/7, and the deprecated site-local fec0::/10.
    UniqueLocal,
    /// 224/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18/15 (also the range the doors hand out), 2001:2::/48.
    Benchmark,
    /// Everything else IANA reserves or that is not global unicast: 192.0.0/24, 192.88.99/24,
    /// 240/4, 100::/64, 2001::/23, 64:ff9b:1::/48, anything outside 2000::/3.
    Reserved,
}

impl Forbidden {
    /// Short description, used after "a"/"an" in refusal messages.
    pub fn describe(self) -> &'static str {
        match self {
            Forbidden::Unspecified => "an unspecified/\"this network\" address",
            Forbidden::Loopback => "a loopback address",
            Forbidden::Private => "a private address (RFC 1918)",
            Forbidden::LinkLocal => "a link-local address (169.254/16 includes cloud metadata)",
            Forbidden::Cgnat => "a carrier-grade NAT address (100.64/10)",
            Forbidden::UniqueLocal => "a unique-local IPv6 address",
            Forbidden::Multicast => "a multicast address",
            Forbidden::Broadcast => "the broadcast address",
            Forbidden::Documentation => "a documentation address",
            Forbidden::Benchmark => "a benchmarking address (198.18/15)",
            Forbidden::Reserved => "a reserved address",
        }
    }
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// Classify an address: `None` for a public unicast address, else the reason it is not one.
///
/// IPv4-mapped (`::ffff:0:0/96`), IPv4-compatible (`::/96`), NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002::/16`) addresses are judged by the IPv4 address they embed.
pub fn classify(addr: IpAddr) -> Option<Forbidden> {
    match addr {
        IpAddr::V4(a) => classify_v4(a),
        IpAddr::V6(a) => classify_v6(a),
    }
}

/// Vet one address against the policy: `Ok` if public or inside one of `allow_cidrs`.
///
/// An embedded IPv4 address (mapped, compatible, NAT64, 6to4) is also checked against
/// `allow_cidrs`, so `::ffff:127.0.0.1` is allowed exactly when `127.0.0.1` is.
pub fn vet(addr: IpAddr, allow_cidrs: &[IpNet]) -> Result<(), Forbidden> {
    if allow_cidrs.iter().any(|n| n.contains(&addr)) {
        return Ok(());
    }
    if let IpAddr::V6(a) = addr
        && let Some(v4) = embedded_v4(a)
    {
        return vet(IpAddr::V4(v4), allow_cidrs);
    }
    match classify(addr) {
        None => Ok(()),
        Some(f) => Err(f),
    }
}

fn classify_v4(a: Ipv4Addr) -> Option<Forbidden> {
    let o = a.octets();
    let in_net = |net: [u8; 4], bits: u32| -> bool {
        let mask = if bits == 0 {
            0
        } else {
            u32::MAX << (32 - bits)
        };
        (u32::from(a) & mask) == (u32::from_be_bytes(net) & mask)
    };
    if o[0] == 0 {
        return Some(Forbidden::Unspecified);
    }
    if o[0] == 127 {
        return Some(Forbidden::Loopback);
    }
    if o[0] == 10 || in_net([172, 16, 0, 0], 12) || in_net([192, 168, 0, 0], 16) {
        return Some(Forbidden::Private);
    }
    if in_net([169, 254, 0, 0], 16) {
        return Some(Forbidden::LinkLocal);
    }
    if in_net([100, 64, 0, 0], 10) {
        return Some(Forbidden::Cgnat);
    }
    if a == Ipv4Addr::BROADCAST {
        return Some(Forbidden::Broadcast);
    }
    if in_net([224, 0, 0, 0], 4) {
        return Some(Forbidden::Multicast);
    }
    if in_net([192, 0, 2, 0], 24) || in_net([198, 51, 100, 0], 24) || in_net([203, 0, 113, 0], 24) {
        return Some(Forbidden::Documentation);
    }
    if in_net([198, 18, 0, 0], 15) {
        return Some(Forbidden::Benchmark);
    }
    if in_net([192, 0, 0, 0], 24) || in_net([192, 88, 99, 0], 24) || in_net([240, 0, 0, 0], 4) {
        return Some(Forbidden::Reserved);
    }
    None
}

/// The IPv4 address embedded in an IPv4-mapped, IPv4-compatible, NAT64 (well-known prefix) or
/// 6to4 address.
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let tail = Ipv4Addr::new(
        (s[6] >> 8) as u8,
        (s[6] & 0xff) as u8,
        (s[7] >> 8) as u8,
        (s[7] & 0xff) as u8,
    );
    match s {
        // ::ffff:a.b.c.d
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(tail),
        // ::a.b.c.d (IPv4-compatible, deprecated); `::` and `::1` are not embedded forms.
        [0, 0, 0, 0, 0, 0, _, _] if u32::from(tail) > 1 => Some(tail),
        // 64:ff9b::a.b.c.d (NAT64 well-known prefix)
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(tail),
        // 2002:AABB:CCDD::/48 (6to4)
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            (hi & 0xff) as u8,
            (lo >> 8) as u8,
            (lo & 0xff) as u8,
        )),
        _ => None,
    }
}

fn classify_v6(a: Ipv6Addr) -> Option<Forbidden> {
    if a.is_unspecified() {
        return Some(Forbidden::Unspecified);
    }
    if a.is_loopback() {
        return Some(Forbidden::Loopback);
    }
    if let Some(v4) = embedded_v4(a) {
        return classify_v4(v4);
    }
    let s = a.segments();
    let in_net = |prefix: Ipv6Addr, bits: u32| -> bool {
        let mask = if bits == 0 {
            0
        } else {
            u128::MAX << (128 - bits)
        };
        (u128::from(a) & mask) == (u128::from(prefix) & mask)
    };
    if s[0] & 0xff00 == 0xff00 {
        return Some(Forbidden::Multicast);
    }
    if s[0] & 0xffc0 == 0xfe80 {
        return Some(Forbidden::LinkLocal);
    }
    if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 {
        return Some(Forbidden::UniqueLocal);
    }
    if in_net(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32)
        || in_net(Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20)
    {
        return Some(Forbidden::Documentation);
    }
    if in_net(Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 0), 48) {
        return Some(Forbidden::Benchmark);
    }
    if in_net(Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23)
        || in_net(Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, 0, 0), 64)
        || in_net(Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48)
    {
        return Some(Forbidden::Reserved);
    }
    // Only 2000::/3 is allocated for global unicast.
    if s[0] & 0xe000 != 0x2000 {
        return Some(Forbidden::Reserved);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use Forbidden as F;

    #[test]
    fn classification_table() {
        let cases: &[(&str, Option<Forbidden>)] = &[
            ("93.184.216.34", None),
            ("1.1.1.1", None),
            ("8.8.8.8", None),
            ("0.0.0.0", Some(F::Unspecified)),
            ("0.1.2.3", Some(F::Unspecified)),
            ("127.0.0.1", Some(F::Loopback)),
            ("127.255.255.254", Some(F::Loopback)),
            ("10.0.0.1", Some(F::Private)),
            ("172.16.0.1", Some(F::Private)),
            ("172.31.255.255", Some(F::Private)),
            ("172.32.0.1", None),
            ("192.168.1.1", Some(F::Private)),
            ("169.254.169.254", Some(F::LinkLocal)),
            ("169.254.0.1", Some(F::LinkLocal)),
            ("100.64.0.1", Some(F::Cgnat)),
            ("100.127.255.255", Some(F::Cgnat)),
            ("100.128.0.1", None),
            ("224.0.0.1", Some(F::Multicast)),
            ("239.255.255.250", Some(F::Multicast)),
            ("255.255.255.255", Some(F::Broadcast)),
            ("240.0.0.1", Some(F::Reserved)),
            ("192.0.0.8", Some(F::Reserved)),
            ("192.88.99.1", Some(F::Reserved)),
            ("192.0.2.1", Some(F::Documentation)),
            ("198.51.100.7", Some(F::Documentation)),
            ("203.0.113.9", Some(F::Documentation)),
            ("198.18.0.1", Some(F::Benchmark)),
            ("198.19.255.255", Some(F::Benchmark)),
            ("198.20.0.1", None),
            ("2606:4700::1111", None),
            ("2a00:1450:4001:80b::200e", None),
            ("::", Some(F::Unspecified)),
            ("::1", Some(F::Loopback)),
            ("::ffff:169.254.169.254", Some(F::LinkLocal)),
            ("::ffff:127.0.0.1", Some(F::Loopback)),
            ("::ffff:10.1.2.3", Some(F::Private)),
            ("::ffff:93.184.216.34", None),
            ("::169.254.169.254", Some(F::LinkLocal)),
            ("::10.0.0.1", Some(F::Private)),
            ("64:ff9b::169.254.169.254", Some(F::LinkLocal)),
            ("64:ff9b::a9fe:a9fe", Some(F::LinkLocal)),
            ("64:ff9b::7f00:1", Some(F::Loopback)),
            ("64:ff9b::93.184.216.34", None),
            ("64:ff9b:1::1", Some(F::Reserved)),
            ("2002:a9fe:a9fe::1", Some(F::LinkLocal)),
            ("2002:5db8:d822::1", None),
            ("fc00::1", Some(F::UniqueLocal)),
            ("fd12:3456::1", Some(F::UniqueLocal)),
            ("fec0::1", Some(F::UniqueLocal)),
            ("fe80::1", Some(F::LinkLocal)),
            ("ff02::1", Some(F::Multicast)),
            ("2001:db8::1", Some(F::Documentation)),
            ("3fff::1", Some(F::Documentation)),
            ("2001:2::1", Some(F::Benchmark)),
            ("2001::1", Some(F::Reserved)),
            ("100::1", Some(F::Reserved)),
            ("4000::1", Some(F::Reserved)),
            ("1::1", Some(F::Reserved)),
        ];
        for (addr, want) in cases {
            let ip: IpAddr = addr.parse().unwrap();
            assert_eq!(classify(ip), *want, "{addr}");
        }
    }

    #[test]
    fn allow_cidrs_exempts_exactly_what_it_names() {
        let allow: Vec<IpNet> = vec![
            "127.0.0.1/32".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
        ];
        let ok = |s: &str| vet(s.parse().unwrap(), &allow);
        assert_eq!(ok("127.0.0.1"), Ok(()));
        assert_eq!(ok("::ffff:127.0.0.1"), Ok(()));
        assert_eq!(ok("127.0.0.2"), Err(F::Loopback));
        assert_eq!(ok("10.1.2.3"), Ok(()));
        assert_eq!(ok("10.2.0.1"), Err(F::Private));
        assert_eq!(ok("169.254.169.254"), Err(F::LinkLocal));
        assert_eq!(ok("64:ff9b::a9fe:a9fe"), Err(F::LinkLocal));
        assert_eq!(ok("93.184.216.34"), Ok(()));
        assert_eq!(vet("127.0.0.1".parse().unwrap(), &[]), Err(F::Loopback));
    }
}
