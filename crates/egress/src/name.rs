//! Host normalisation: the one place where a string a tool sent becomes either a DNS name or an
//! IP literal.
//!
//! The allowlist is checked on the result of [`normalize_host`], before any DNS lookup, so the
//! rules here decide what a denied name can and cannot smuggle past the check:
//!
//! - lowercase, strip one trailing dot, IDNA (UTS 46) to ASCII/punycode, reject invalid names;
//! - reject userinfo (`user@host`);
//! - every IPv4 form that libc's `inet_aton` accepts (decimal `2852039166`, octal
//!   `0251.0376.0251.0376`, hex `0xa9fea9fe`, short forms `169.254.43518`) and bracketed IPv6
//!   (`[::ffff:169.254.169.254]`) is an IP literal, never a name;
//! - a name whose last label is numeric (`1.2.3.999`, `0x1g` is fine, `example.123` is not) is
//!   rejected: no real top-level domain is numeric, and resolvers disagree on such strings.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A normalised destination host.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name in lowercase ASCII (punycode for IDNs), without a trailing dot.
    Name(String),
    /// An IP literal, whatever form it was written in.
    Ip(IpAddr),
}

impl Host {
    /// The name, if this is a name.
    pub fn as_name(&self) -> Option<&str> {
        match self {
            Host::Name(n) => Some(n),
            Host::Ip(_) => None,
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// Why a host string is not a usable destination.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Nothing where a host was expected.
    #[error("empty host")]
    Empty,
    /// `user@host` or `user:pass@host`.
    #[error("userinfo (`user@`) is not allowed in a host")]
    Userinfo,
    /// `[...]` that is not an IPv6 address.
    #[error("`{0}` is not a valid bracketed IPv6 address")]
    BadIpv6(String),
    /// IDNA (UTS 46) processing failed.
    #[error("`{0}` is not a valid internationalised domain name")]
    Idna(String),
    /// A label with characters other than letters, digits, `-` and `_`, empty, too long, or
    /// starting or ending with `-`.
    #[error("`{name}` is not a valid host name: bad label `{label}`")]
    BadLabel {
        /// The (normalised) name.
        name: String,
        /// The offending label.
        label: String,
    },
    /// More than 253 characters.
    #[error("host name is longer than 253 characters")]
    TooLong,
    /// The last label is numeric but the whole is not a valid IPv4 literal.
    #[error("`{0}` looks like an IPv4 address but is not a valid one")]
    BadNumeric(String),
}

/// Normalise a host as it appears in a CONNECT authority, an absolute URI, a DNS query or an
/// allowlist entry (without the port).
///
/// The result is an IP literal for every form `inet_aton` accepts, even after IDNA mapping
/// (fullwidth digits and ideographic full stops map to ASCII ones first).
pub fn normalize_host(raw: &str) -> Result<Host, NameError> {
    if raw.is_empty() {
        return Err(NameError::Empty);
    }
    if raw.contains('@') {
        return Err(NameError::Userinfo);
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| NameError::BadIpv6(raw.to_string()))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|a| Host::Ip(IpAddr::V6(a)))
            .map_err(|_| NameError::BadIpv6(raw.to_string()));
    }
    // A bare IPv6 literal (allowlist entries, DNS answers): only when it parses as one.
    if raw.contains(':') {
        return raw
            .parse::<Ipv6Addr>()
            .map(|a| Host::Ip(IpAddr::V6(a)))
            .map_err(|_| NameError::BadIpv6(raw.to_string()));
    }
    let lower = raw.to_ascii_lowercase();
    let stripped = lower.strip_suffix('.').unwrap_or(&lower);
    if stripped.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(a) = parse_ipv4_literal(stripped) {
        return Ok(Host::Ip(IpAddr::V4(a)));
    }
    let ascii = idna::domain_to_ascii_cow(stripped.as_bytes(), idna::AsciiDenyList::URL)
        .map_err(|_| NameError::Idna(raw.to_string()))?;
    // IDNA maps U+3002 and friends to '.', so a trailing dot can appear only now.
    let ascii = ascii.strip_suffix('.').unwrap_or(&ascii).to_string();
    if ascii.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(a) = parse_ipv4_literal(&ascii) {
        return Ok(Host::Ip(IpAddr::V4(a)));
    }
    check_labels(&ascii)?;
    Ok(Host::Name(ascii))
}

fn check_labels(name: &str) -> Result<(), NameError> {
    if name.len() > 253 {
        return Err(NameError::TooLong);
    }
    let bad = |label: &str| NameError::BadLabel {
        name: name.to_string(),
        label: label.to_string(),
    };
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty()
            || label.len() > 63
            || label.starts_with('-')
            || label.ends_with('-')
            || !label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err(bad(label));
        }
        last = label;
    }
    if looks_numeric(last) {
        return Err(NameError::BadNumeric(name.to_string()));
    }
    Ok(())
}

/// The WHATWG URL "ends in a number" test for the last label: all decimal digits, or `0x`
/// followed by hex digits.
fn looks_numeric(label: &str) -> bool {
    if !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match label.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// Parse an IPv4 literal exactly as glibc's `inet_aton` does.
///
/// One to four parts separated by `.`; each part starts with a digit and is read like C's
/// `strtoul(.., 0)`: `0x`/`0X` hex, leading `0` octal, otherwise decimal. With fewer than four
/// parts the last one fills the remaining bytes (`a.b` = a.(24-bit b)). Trailing ASCII
/// whitespace ends the string (anything after it is ignored, as in glibc).
pub fn parse_ipv4_literal(s: &str) -> Option<Ipv4Addr> {
    let b = s.as_bytes();
    let mut i = 0usize;
    let mut parts: [u32; 4] = [0; 4];
    let mut n = 0usize;
    let last: u64;
    loop {
        if i >= b.len() || !b[i].is_ascii_digit() {
            return None;
        }
        // strtoul with base 0.
        let (value, consumed) = strtoul0(&b[i..])?;
        i += consumed;
        if i < b.len() && b[i] == b'.' {
            if n > 2 || value > 0xff {
                return None;
            }
            // value <= 0xff, checked just above.
            parts[n] = value as u32;
            n += 1;
            i += 1;
        } else {
            last = value;
            break;
        }
    }
    if i < b.len() && !is_c_space(b[i]) {
        return None;
    }
    let max: u64 = match n {
        0 => 0xffff_ffff,
        1 => 0x00ff_ffff,
        2 => 0xffff,
        _ => 0xff,
    };
    if last > max {
        return None;
    }
    let mut word: u32 = 0;
    for (k, p) in parts.iter().take(n).enumerate() {
        word |= p << (24 - 8 * k);
    }
    // last <= max <= u32::MAX, checked just above.
    word |= last as u32;
    Some(Ipv4Addr::from(word))
}

fn is_c_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r')
}

/// `strtoul(s, &end, 0)` for a string that starts with a digit: returns the value and the
/// number of bytes consumed, or `None` on overflow past `u32::MAX` (glibc's `inet_aton`
/// rejects those).
fn strtoul0(s: &[u8]) -> Option<(u64, usize)> {
    let (base, start) = if s.len() >= 3
        && s[0] == b'0'
        && (s[1] == b'x' || s[1] == b'X')
        && s[2].is_ascii_hexdigit()
    {
        (16u64, 2usize)
    } else if s[0] == b'0' {
        (8, 0)
    } else {
        (10, 0)
    };
    let mut v: u64 = 0;
    let mut i = start;
    while i < s.len() {
        let d = match s[i] {
            c @ b'0'..=b'9' => u64::from(c - b'0'),
            c @ b'a'..=b'f' => u64::from(c - b'a' + 10),
            c @ b'A'..=b'F' => u64::from(c - b'A' + 10),
            _ => break,
        };
        if d >= base {
            break;
        }
        v = v * base + d;
        if v > 0xffff_ffff {
            return None;
        }
        i += 1;
    }
    Some((v, i))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(s: &str) -> Option<String> {
        parse_ipv4_literal(s).map(|a| a.to_string())
    }

    #[test]
    fn inet_aton_forms() {
        let meta = Some("169.254.169.254".to_string());
        assert_eq!(v4("169.254.169.254"), meta);
        assert_eq!(v4("2852039166"), meta);
        assert_eq!(v4("0251.0376.0251.0376"), meta);
        assert_eq!(v4("0xa9fea9fe"), meta);
        assert_eq!(v4("0XA9FEA9FE"), meta);
        assert_eq!(v4("169.254.43518"), meta);
        assert_eq!(v4("169.16689662"), meta);
        assert_eq!(v4("0xa9.0xfe.0xa9.0xfe"), meta);
        assert_eq!(v4("0251.0xfe.169.0376"), meta);
        assert_eq!(v4("127.1"), Some("127.0.0.1".into()));
        assert_eq!(v4("0"), Some("0.0.0.0".into()));
        assert_eq!(v4("0x7f000001"), Some("127.0.0.1".into()));
        assert_eq!(v4("1.2.3.4 trailing"), Some("1.2.3.4".into()));
        assert_eq!(v4("00000000000000000001"), Some("0.0.0.1".into()));
    }

    #[test]
    fn inet_aton_rejects() {
        for s in [
            "",
            ".",
            "1.",
            "1.2.3.4.",
            "1..2",
            "256.1.1.1",
            "1.2.3.256",
            "1.2.65536",
            "1.16777216",
            "4294967296",
            "08",
            "09.1.1.1",
            "0x",
            "0x.1",
            "0xg",
            "1.2.3.4.5",
            "a.b.c.d",
            "1.2.3.4x",
            "-1",
            "+1",
            " 1.2.3.4",
            "1.2.3.0x",
            "99999999999999999999",
        ] {
            assert_eq!(v4(s), None, "{s:?} must not parse");
        }
    }

    #[test]
    fn normalisation_table() {
        let meta = Host::Ip("169.254.169.254".parse().unwrap());
        let cases: &[(&str, Result<Host, ()>)] = &[
            ("Example.COM", Ok(Host::Name("example.com".into()))),
            ("example.com.", Ok(Host::Name("example.com".into()))),
            (
                "bücher.example",
                Ok(Host::Name("xn--bcher-kva.example".into())),
            ),
            (
                "BÜCHER.example.",
                Ok(Host::Name("xn--bcher-kva.example".into())),
            ),
            (
                "xn--bcher-kva.example",
                Ok(Host::Name("xn--bcher-kva.example".into())),
            ),
            (
                "api_v2.example.com",
                Ok(Host::Name("api_v2.example.com".into())),
            ),
            ("169.254.169.254", Ok(meta.clone())),
            ("169.254.169.254.", Ok(meta.clone())),
            ("2852039166", Ok(meta.clone())),
            ("0251.0376.0251.0376", Ok(meta.clone())),
            ("0xA9FEA9FE", Ok(meta.clone())),
            ("169.254.43518", Ok(meta.clone())),
            // Fullwidth digits and ideographic full stops map to an IPv4 literal.
            ("１６９。２５４。１６９。２５４", Ok(meta.clone())),
            (
                "[::ffff:169.254.169.254]",
                Ok(Host::Ip("::ffff:169.254.169.254".parse().unwrap())),
            ),
            ("[::1]", Ok(Host::Ip("::1".parse().unwrap()))),
            ("::1", Ok(Host::Ip("::1".parse().unwrap()))),
            ("user@example.com", Err(())),
            ("user:pw@example.com", Err(())),
            ("", Err(())),
            (".", Err(())),
            ("..", Err(())),
            ("a..b", Err(())),
            ("-a.example", Err(())),
            ("a-.example", Err(())),
            ("exa mple.com", Err(())),
            ("example.com/", Err(())),
            ("1.2.3.999", Err(())),
            ("example.123", Err(())),
            ("example.0x1f", Err(())),
            ("[::1", Err(())),
            ("[example.com]", Err(())),
            ("xn--a.example", Err(())),
        ];
        for (input, want) in cases {
            let got = normalize_host(input);
            match want {
                Ok(h) => assert_eq!(got.as_ref(), Ok(h), "{input:?}"),
                Err(()) => assert!(got.is_err(), "{input:?} must be rejected, got {got:?}"),
            }
        }
        let long = format!("{}.example", "a".repeat(64));
        assert!(matches!(
            normalize_host(&long),
            Err(NameError::BadLabel { .. })
        ));
        let too_long = ["abcdefghij"; 24].join(".") + ".example";
        assert_eq!(normalize_host(&too_long), Err(NameError::TooLong));
        assert_eq!(normalize_host("user@example.com"), Err(NameError::Userinfo));
    }
}

#[cfg(test)]
mod prop {
    use super::*;
    use proptest::prelude::*;

    /// One part of an IPv4 literal written in a given base, with optional leading zeros.
    fn render(v: u32, base: u8, upper: bool, zeros: usize) -> String {
        match base {
            8 => format!("0{}{v:o}", "0".repeat(zeros)),
            16 if upper => format!("0X{}{v:X}", "0".repeat(zeros)),
            16 => format!("0x{}{v:x}", "0".repeat(zeros)),
            // Decimal has no leading zeros (a leading zero means octal).
            _ => v.to_string(),
        }
    }

    proptest! {
        /// Every way of writing an address that inet_aton accepts parses back to it.
        #[test]
        fn any_encoding_round_trips(
            addr: u32,
            parts in 1usize..=4,
            bases in proptest::collection::vec(prop_oneof![Just(8u8), Just(10u8), Just(16u8)], 4),
            upper: bool,
            zeros in 0usize..3,
            trailing in prop_oneof![Just(""), Just(" "), Just("\t"), Just(" junk")],
        ) {
            let o = addr.to_be_bytes();
            let values: Vec<u32> = match parts {
                1 => vec![addr],
                2 => vec![u32::from(o[0]), addr & 0x00ff_ffff],
                3 => vec![u32::from(o[0]), u32::from(o[1]), addr & 0xffff],
                _ => o.iter().map(|b| u32::from(*b)).collect(),
            };
            let s: Vec<String> = values
                .iter()
                .zip(&bases)
                .map(|(v, b)| render(*v, *b, upper, zeros))
                .collect();
            let s = format!("{}{trailing}", s.join("."));
            prop_assert_eq!(parse_ipv4_literal(&s), Some(Ipv4Addr::from(addr)), "{}", s);
            // Without trailing junk it is also an IP literal for the normaliser.
            if trailing.is_empty() {
                prop_assert_eq!(normalize_host(&s), Ok(Host::Ip(IpAddr::V4(Ipv4Addr::from(addr)))));
            }
        }

        /// Whatever the input, the parser neither panics nor accepts a string that does not
        /// start with a digit.
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            if let Some(_a) = parse_ipv4_literal(&s) {
                prop_assert!(s.as_bytes()[0].is_ascii_digit());
            }
        }
    }
}
