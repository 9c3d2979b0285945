//! Host normalisation: the one place where a string a tool sent becomes either a DNS name or an
//! IP literal.
//!
//! The allowlist (and every binding) is checked on the result of [`normalize_host`], before any
//! DNS lookup, so the rules here decide what a denied name can and cannot smuggle past the
//! check. A string that is not a valid host name is refused with the reason, never repaired
//! into one:
//!
//! - only letters, digits, `-` and `.` in ASCII (anything else, `_`, `%`, spaces, NUL and other
//!   control characters included, is refused); non-ASCII text is IDNA (UTS 46) mapped to
//!   ASCII/punycode first, and what it maps to must obey the same rules;
//! - RFC 1123 labels: 1 to 63 characters, not starting or ending with `-`, no empty label
//!   (`a..b`), at most 253 characters in all, at most one trailing dot (`evil.com.` is
//!   `evil.com`, `evil.com..` is refused); an `xn--` label must be valid punycode of a
//!   non-ASCII label, written in its one canonical form;
//! - ASCII letters are lowercased (DNS names are case-insensitive);
//! - reject userinfo (`user@host`);
//! - every IPv4 form that libc's `inet_aton` accepts (decimal `2852039166`, octal
//!   `0251.0376.0251.0376`, hex `0xa9fea9fe`, short forms `169.254.43518`) and bracketed IPv6
//!   (`[::ffff:169.254.169.254]`) is an IP literal, never a name;
//! - a name whose last label is numeric (`1.2.3.999`, `0x1g` is fine, `example.123` is not) is
//!   rejected: no real top-level domain is numeric, and resolvers disagree on such strings.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};

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
    /// A character that no host name may contain (outside IDNA's mapping): `_`, `%`,
    /// whitespace, control characters, ...
    #[error("`{name}` is not a valid host name: {what} is not allowed in a host name")]
    BadChar {
        /// The host as written (made printable).
        name: String,
        /// The character, described (`'%'`, `U+0000`).
        what: String,
    },
    /// More than one trailing dot (`evil.com..`).
    #[error("`{0}` is not a valid host name: more than one trailing dot")]
    TrailingDots(String),
    /// A label that breaks RFC 1123 (or is not canonical punycode).
    #[error("`{name}` is not a valid host name: label `{label}` {why}")]
    BadLabel {
        /// The (normalised) name.
        name: String,
        /// The offending label.
        label: String,
        /// What is wrong with it.
        why: &'static str,
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
            .ok_or_else(|| NameError::BadIpv6(printable(raw)))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|a| Host::Ip(IpAddr::V6(a)))
            .map_err(|_| NameError::BadIpv6(printable(raw)));
    }
    // A bare IPv6 literal (allowlist entries, DNS answers): only when it parses as one.
    if raw.contains(':') {
        return raw
            .parse::<Ipv6Addr>()
            .map(|a| Host::Ip(IpAddr::V6(a)))
            .map_err(|_| NameError::BadIpv6(printable(raw)));
    }
    // Before anything else: no ASCII character outside letters, digits, `-` and `.` (so
    // `1.2.3.4 junk` is not the IPv4 literal inet_aton would read, and `%2e` is no dot).
    bad_ascii(raw, raw)?;
    let lower = raw.to_ascii_lowercase();
    let (stripped, had_dot) = match lower.strip_suffix('.') {
        Some(s) => (s, true),
        None => (lower.as_str(), false),
    };
    if stripped.is_empty() {
        return Err(NameError::Empty);
    }
    if stripped.ends_with('.') {
        return Err(NameError::TrailingDots(printable(raw)));
    }
    if let Some(a) = parse_ipv4_literal(stripped) {
        return Ok(Host::Ip(IpAddr::V4(a)));
    }
    let ascii = if stripped.is_ascii() {
        stripped.to_string()
    } else {
        let mapped = Uts46::new()
            .to_ascii(
                stripped.as_bytes(),
                AsciiDenyList::STD3,
                Hyphens::CheckFirstLast,
                DnsLength::Ignore,
            )
            .map_err(|_| NameError::Idna(printable(raw)))?;
        // What IDNA mapped to (fullwidth letters, ideographic full stops) obeys the same rules.
        bad_ascii(&mapped, raw)?;
        // IDNA maps U+3002 and friends to '.', so a trailing dot can appear only now: one in
        // all, written either way.
        match mapped.strip_suffix('.') {
            Some(_) if had_dot => return Err(NameError::TrailingDots(printable(raw))),
            Some(m) if m.ends_with('.') => {
                return Err(NameError::TrailingDots(printable(raw)));
            }
            Some(m) => m.to_string(),
            None => mapped.into_owned(),
        }
    };
    if ascii.is_empty() {
        return Err(NameError::Empty);
    }
    if let Some(a) = parse_ipv4_literal(&ascii) {
        return Ok(Host::Ip(IpAddr::V4(a)));
    }
    check_labels(&ascii)?;
    Ok(Host::Name(ascii))
}

/// `raw` made safe to show in one line: printable ASCII, other characters as `U+XXXX`.
fn printable(raw: &str) -> String {
    let mut out = String::new();
    for c in raw.chars().take(256) {
        if c.is_ascii_graphic() {
            out.push(c);
        } else {
            out.push_str(&format!("U+{:04X}", u32::from(c)));
        }
    }
    if raw.chars().count() > 256 {
        out.push_str("...");
    }
    out
}

/// The first ASCII character of `s` that no host name may contain, refused (non-ASCII
/// characters are left to IDNA).
fn bad_ascii(s: &str, raw: &str) -> Result<(), NameError> {
    match s
        .chars()
        .find(|c| c.is_ascii() && !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
    {
        Some(c) => Err(NameError::BadChar {
            name: printable(raw),
            what: if c.is_ascii_graphic() {
                format!("'{c}'")
            } else {
                format!("U+{:04X}", u32::from(c))
            },
        }),
        None => Ok(()),
    }
}

fn check_labels(name: &str) -> Result<(), NameError> {
    if name.len() > 253 {
        return Err(NameError::TooLong);
    }
    let bad = |label: &str, why: &'static str| NameError::BadLabel {
        name: name.to_string(),
        label: label.to_string(),
        why,
    };
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return Err(bad(label, "is empty"));
        }
        if label.len() > 63 {
            return Err(bad(label, "is longer than 63 characters"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(bad(label, "starts or ends with `-`"));
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(bad(
                label,
                "has a character other than a letter, digit or `-`",
            ));
        }
        if label.starts_with("xn--") {
            check_a_label(label).map_err(|why| bad(label, why))?;
        }
        last = label;
    }
    if looks_numeric(last) {
        return Err(NameError::BadNumeric(name.to_string()));
    }
    Ok(())
}

/// An `xn--` label must decode (punycode, UTS 46 validity) to a label with a non-ASCII
/// character whose encoding is exactly this label.
fn check_a_label(label: &str) -> Result<(), &'static str> {
    let (unicode, ok) = idna::domain_to_unicode(label);
    if ok.is_err() {
        return Err("is not valid punycode");
    }
    if unicode.is_ascii() {
        return Err("is punycode of a plain ASCII label");
    }
    let back = Uts46::new()
        .to_ascii(
            unicode.as_bytes(),
            AsciiDenyList::STD3,
            Hyphens::CheckFirstLast,
            DnsLength::Ignore,
        )
        .map_err(|_| "is not valid punycode")?;
    if back != label {
        return Err("is not the canonical punycode of its label");
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
            ("api_v2.example.com", Err(())),
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

    fn why(s: &str) -> String {
        match normalize_host(s) {
            Ok(h) => panic!("{s:?} must be refused, got {h:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn strict_names_are_refused_with_the_reason() {
        let name = normalize_host;
        // One trailing dot is the same name; two are not a name, however written.
        assert_eq!(name("evil.com."), Ok(Host::Name("evil.com".into())));
        assert_eq!(
            why("evil.com.."),
            "`evil.com..` is not a valid host name: more than one trailing dot"
        );
        assert_eq!(
            why("evil.com.\u{3002}"),
            "`evil.com.U+3002` is not a valid host name: more than one trailing dot"
        );
        assert_eq!(
            why("evil.com\u{3002}."),
            "`evil.comU+3002.` is not a valid host name: more than one trailing dot"
        );
        assert_eq!(
            why("evil.com\u{3002}\u{3002}"),
            "`evil.comU+3002U+3002` is not a valid host name: more than one trailing dot"
        );
        assert_eq!(name("evil.com\u{3002}"), Ok(Host::Name("evil.com".into())));
        assert_eq!(
            why("a..b"),
            "`a..b` is not a valid host name: label `` is empty"
        );
        assert_eq!(
            why(".a.com"),
            "`.a.com` is not a valid host name: label `` is empty"
        );
        assert_eq!(
            why("-a.com"),
            "`-a.com` is not a valid host name: label `-a` starts or ends with `-`"
        );
        assert_eq!(
            why("a-.com"),
            "`a-.com` is not a valid host name: label `a-` starts or ends with `-`"
        );
        // Percent-encoding is not decoded into a dot, or anything else.
        assert_eq!(
            why("evil%2ecom"),
            "`evil%2ecom` is not a valid host name: '%' is not allowed in a host name"
        );
        assert_eq!(
            why("allowed.example%00.evil.com"),
            "`allowed.example%00.evil.com` is not a valid host name: '%' is not allowed in a host name"
        );
        // Embedded NUL, whitespace, control characters.
        assert_eq!(
            why("allowed.example\0.evil.com"),
            "`allowed.exampleU+0000.evil.com` is not a valid host name: U+0000 is not allowed in a host name"
        );
        assert_eq!(
            why("evil.com "),
            "`evil.comU+0020` is not a valid host name: U+0020 is not allowed in a host name"
        );
        assert!(why("evil.com\t").contains("U+0009 is not allowed"));
        assert!(why(" evil.com").contains("U+0020 is not allowed"));
        assert!(why("evil.com\r\n").contains("U+000D is not allowed"));
        // An IP literal with trailing junk is not the literal inet_aton would read.
        assert!(why("1.2.3.4 junk").contains("U+0020 is not allowed"));
        assert!(why("93.184.216.34\t").contains("U+0009 is not allowed"));
        // Ideographic space maps to a space under IDNA: still refused.
        assert!(normalize_host("evil.com\u{3000}").is_err());
        assert!(normalize_host("１.２.３.４\u{3000}").is_err());
        // Underscores, slashes, backslashes, other punctuation.
        for s in [
            "api_v2.example.com",
            "_dmarc.example.com",
            "evil.com/",
            "evil.com\\",
            "evil.com#",
            "evil.com?x",
            "ev*l.com",
            "evil,com",
            "evil;com",
        ] {
            assert!(
                matches!(normalize_host(s), Err(NameError::BadChar { .. })),
                "{s:?}: {:?}",
                normalize_host(s)
            );
        }
        // Fullwidth punctuation maps to ASCII punctuation: refused too.
        assert!(normalize_host("evil\u{FF05}2ecom").is_err());
        assert!(normalize_host("evil\u{FF3F}x.com").is_err());
        // Uppercase is the same name (DNS is case-insensitive).
        assert_eq!(name("EVIL.COM"), Ok(Host::Name("evil.com".into())));
        assert_eq!(
            name("Api.Example.Com."),
            Ok(Host::Name("api.example.com".into()))
        );
        assert_eq!(
            name("XN--BCHER-KVA.example"),
            Ok(Host::Name("xn--bcher-kva.example".into()))
        );
        // xn-- oddities: empty, invalid punycode, punycode of plain ASCII, not canonical.
        assert_eq!(
            why("xn--.example"),
            "`xn--.example` is not a valid host name: label `xn--` starts or ends with `-`"
        );
        assert_eq!(
            why("xn--a.example"),
            "`xn--a.example` is not a valid host name: label `xn--a` is not valid punycode"
        );
        assert!(why("xn--abc-.example").contains("label `xn--abc-` starts or ends with `-`"));
        // Lengths.
        assert_eq!(
            why(&format!("{}.com", "a".repeat(64))),
            format!(
                "`{}.com` is not a valid host name: label `{}` is longer than 63 characters",
                "a".repeat(64),
                "a".repeat(64)
            )
        );
        assert!(name(&format!("{}.com", "a".repeat(63))).is_ok());
        let max = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(max.len(), 253);
        assert!(name(&max).is_ok());
        assert!(name(&format!("{max}.")).is_ok());
        assert_eq!(name(&format!("{max}e")), Err(NameError::TooLong));
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

    /// A valid host name whose last label starts with a letter (so it is never numeric).
    fn valid_name() -> impl Strategy<Value = String> {
        let label = "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?";
        let last = "[a-z]([a-z0-9-]{0,20}[a-z0-9])?";
        (proptest::collection::vec(label, 0..4), last).prop_map(|(mut v, l)| {
            v.push(l);
            v.join(".")
        })
    }

    /// RFC 1123, written out independently of the code under test.
    fn rfc1123(n: &str) -> bool {
        n.len() <= 253
            && n.split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
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

        /// A valid name, in any case and with at most one trailing dot, is accepted as itself
        /// in lowercase.
        #[test]
        fn valid_names_are_accepted(n in valid_name(), upper in proptest::collection::vec(any::<bool>(), 253), dot: bool) {
            let written: String = n
                .chars()
                .zip(&upper)
                .map(|(c, u)| if *u { c.to_ascii_uppercase() } else { c })
                .collect();
            let written = if dot { format!("{written}.") } else { written };
            prop_assert_eq!(normalize_host(&written), Ok(Host::Name(n.clone())), "{}", written);
        }

        /// A valid name with one bad character inserted anywhere, a second trailing dot, or an
        /// empty label is refused, never repaired into the valid one.
        #[test]
        fn broken_names_are_refused(
            n in valid_name(),
            at in any::<proptest::sample::Index>(),
            bad in prop_oneof![
                Just('\0'), Just(' '), Just('\t'), Just('\n'), Just('%'), Just('_'), Just('/'),
                Just('\\'), Just('*'), Just(','), Just('\u{7f}'), Just('\u{3000}'), Just('\u{ff3f}'),
                Just('\u{ff05}'),
            ],
        ) {
            let i = at.index(n.len() + 1);
            let mut with_bad = n.clone();
            with_bad.insert(i, bad);
            prop_assert!(normalize_host(&with_bad).is_err(), "{:?}", with_bad);
            let two = format!("{n}..");
            let lead = format!(".{n}");
            prop_assert!(normalize_host(&two).is_err(), "{:?}", two);
            prop_assert!(normalize_host(&lead).is_err(), "{:?}", lead);
            let dots: Vec<usize> = n.match_indices('.').map(|(k, _)| k).collect();
            if !dots.is_empty() {
                let k = dots[at.index(dots.len())];
                let mut doubled = n.clone();
                doubled.insert(k, '.');
                prop_assert!(normalize_host(&doubled).is_err(), "{:?}", doubled);
            }
        }

        /// Whatever the input, an accepted name is a valid RFC 1123 host name (checked here
        /// independently), and normalising it again gives itself.
        #[test]
        fn accepted_names_are_valid(s in prop_oneof![
            "\\PC{0,40}",
            "[a-zA-Z0-9.\\-_% \u{3002}\u{ff0e}\u{ff41}\u{0}]{0,30}",
            "(xn--)?[a-z0-9-]{0,12}(\\.(xn--)?[a-z0-9-]{0,12}){0,3}\\.?\\.?",
        ]) {
            if let Ok(Host::Name(n)) = normalize_host(&s) {
                prop_assert!(rfc1123(&n), "{:?} -> {:?}", s, n);
                prop_assert_eq!(normalize_host(&n), Ok(Host::Name(n.clone())));
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
