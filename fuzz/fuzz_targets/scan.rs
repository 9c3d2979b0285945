//! Fuzz interception's scanners and substitution, each with fuzzed bytes around a rendering of
//! a secret and the stream cut wherever the input says:
//!
//! - the reflected-token redactor (responses of bound endpoints): no form of the token is
//!   left in what reaches the tool, and the output is the same however the stream was cut;
//! - the placeholder scanner (request bodies, tunnelled bytes): a placeholder rendered in any
//!   of the forms it looks for is found, and the verdict is the same however the stream was
//!   cut;
//! - substitution on a request head: a request that goes upstream carries no placeholder, and
//!   a token only in its secret's own place.
//!
//! Input: a mode byte, a form byte, a position byte, then cut sizes (one byte each, up to the
//! first 0), then the data.
#![no_main]

use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use cordon_egress::harness::{Harness, Substituted, redact_stream, redact_value, scan_stream};
use cordon_egress::{
    Binding, EgressPolicy, EventSink, Injection, Injections, Interception, Placement, SessionCa,
    TokenSource, UpstreamTrust,
};
use libfuzzer_sys::fuzz_target;
use zeroize::Zeroizing;

/// (secret, token, placeholder): tokens with characters every encoding changes.
const TOKENS: [(&str, &str, &str); 2] = [
    (
        "API",
        "rt/9+\"x\"=Zq8W-tok~ens",
        "cordon-ph-Q7m2Xw9kLp3vZ8rT4nB6yH1s",
    ),
    (
        "OTHER",
        "second_secret.42",
        "cordon-ph-zzzzzzzzzzzzzzzzzzzz",
    ),
];

fn json(s: &str, slash: bool) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if slash => out.push_str("\\/"),
            c => out.push(c),
        }
    }
    out
}

/// Renderings of `s` a response or a request may carry it in.
fn renderings(s: &str, prefix: &str) -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![
        s.as_bytes().to_vec(),
        json(s, false).into_bytes(),
        json(s, true).into_bytes(),
        s.chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect::<String>()
            .into_bytes(),
        s.chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect::<String>()
            .into_bytes(),
        s.bytes()
            .map(|b| format!("%{b:02X}"))
            .collect::<String>()
            .into_bytes(),
        s.bytes()
            .map(|b| format!("%{b:02x}"))
            .collect::<String>()
            .into_bytes(),
        s.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect::<String>()
            .into_bytes(),
    ];
    for e in [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        v.push(e.encode(format!("{prefix}{s}").as_bytes()).into_bytes());
    }
    v
}

/// The stable part of a rendering: what must never survive redaction.
fn probe(form: &[u8]) -> &[u8] {
    if form.len() > 8 {
        &form[2..form.len() - 2]
    } else {
        form
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn cut<'a>(data: &'a [u8], sizes: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < data.len() {
        let n = if sizes.is_empty() {
            data.len()
        } else {
            usize::from(sizes[i % sizes.len()])
        };
        let end = (at + n.max(1)).min(data.len());
        out.push(&data[at..end]);
        at = end;
        i += 1;
    }
    out
}

#[derive(Debug)]
struct Fixed(&'static str);

impl TokenSource for Fixed {
    fn current(&self) -> Result<Zeroizing<String>, String> {
        Ok(Zeroizing::new(self.0.to_string()))
    }
}

static H: LazyLock<Harness> = LazyLock::new(|| {
    let bind = |path: Option<&str>, placement: Placement| Binding {
        host: "api.example".into(),
        port: 443,
        path_prefix: path.map(str::to_string),
        placement,
        upstream_ca: None,
    };
    let inj = vec![
        Injection {
            secret: "API".into(),
            placeholder: TOKENS[0].2.into(),
            binding: bind(
                Some("/rest"),
                Placement::Header {
                    name: "authorization".into(),
                    template: "Bearer {token}".into(),
                },
            ),
            source: Arc::new(Fixed("Tk7HdrSecretValue9Q2w")),
        },
        Injection {
            secret: "OTHER".into(),
            placeholder: TOKENS[1].2.into(),
            binding: bind(
                None,
                Placement::Query {
                    param: "key".into(),
                },
            ),
            source: Arc::new(Fixed("Tk7QrySecretValue8R3e")),
        },
    ];
    let ca = Arc::new(SessionCa::new("fuzz").expect("session CA"));
    let trust = UpstreamTrust::from_pem(ca.cert_pem()).expect("trust");
    let icpt = Interception::new(Injections::new(inj), ca, trust).expect("interception");
    let policy = EgressPolicy::allowlist("fuzz", ["api.example:443"]).expect("policy");
    Harness::new(Arc::new(policy), EventSink::discard(), Some(icpt)).expect("harness")
});

fuzz_target!(|input: &[u8]| {
    let [mode, form, pos, rest @ ..] = input else {
        return;
    };
    let stop = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let sizes = &rest[..stop];
    let data = rest.get(stop + 1..).unwrap_or(&[]);
    let at = usize::from(*pos) * data.len() / 256;
    let prefix = ["", "a", "ab", "Bearer ", "u:"][usize::from(form >> 4) % 5];
    match mode % 3 {
        0 => {
            // Redaction of a token coming back.
            let r = renderings(TOKENS[0].1, prefix);
            let f = &r[usize::from(form & 15) % r.len()];
            let whole = [&data[..at], f.as_slice(), &data[at..]].concat();
            let (out, found) = redact_stream(&TOKENS, &cut(&whole, sizes));
            let (once, _) = redact_stream(&TOKENS, &[&whole]);
            assert_eq!(out, once, "the output depends on where the stream was cut");
            assert!(found.iter().any(|s| s == "API"), "not found: {found:?}");
            for g in renderings(TOKENS[0].1, prefix) {
                // A part of a rendering the fuzzed bytes hold themselves is no token.
                if contains(data, probe(&g)) {
                    continue;
                }
                assert!(
                    !contains(&out, probe(&g)),
                    "{:?} left in {:?}",
                    String::from_utf8_lossy(probe(&g)),
                    String::from_utf8_lossy(&out)
                );
            }
            assert!(!contains(&out, TOKENS[0].1.as_bytes()));
            let value = redact_value(&TOKENS, &whole).expect("a whole value with a token");
            assert!(!contains(&value, TOKENS[0].1.as_bytes()));
        }
        1 => {
            // The placeholder scanner.
            let pairs: Vec<(&str, &str)> = TOKENS.iter().map(|(s, _, p)| (*s, *p)).collect();
            let r = renderings(TOKENS[0].2, prefix);
            let f = &r[usize::from(form & 15) % r.len()];
            // After a backslash, an escape's own backslash is escaped: literal text (as JSON
            // reads it), not the placeholder.
            let sep: &[u8] = if data[..at].ends_with(b"\\") {
                b" "
            } else {
                b""
            };
            let whole = [&data[..at], sep, f.as_slice(), &data[at..]].concat();
            let hit = scan_stream(&pairs, &cut(&whole, sizes));
            assert!(hit.is_some(), "a placeholder not found");
            let plain = scan_stream(&pairs, &cut(data, sizes));
            let once = scan_stream(&pairs, &[data]);
            assert_eq!(
                plain.is_some(),
                once.is_some(),
                "the verdict depends on where the stream was cut"
            );
        }
        _ => {
            // Substitution: the data is a target, then header lines.
            let text = String::from_utf8_lossy(data);
            let mut lines = text.split('\n');
            let target = lines.next().unwrap_or("/");
            let headers: Vec<(&[u8], &[u8])> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().as_bytes(), v.trim().as_bytes()))
                .collect();
            let pairs: Vec<(&str, &str)> = TOKENS.iter().map(|(s, _, p)| (*s, *p)).collect();
            let host = if form & 1 == 0 {
                "api.example"
            } else {
                "other.example"
            };
            match H.substitute(host, 443, target.as_bytes(), &headers) {
                Substituted::Sent {
                    target,
                    headers,
                    injected,
                } => {
                    assert_eq!(scan_stream(&pairs, &[target.as_bytes()]), None, "{target}");
                    for (k, v) in &headers {
                        assert_eq!(scan_stream(&pairs, &[k.as_bytes()]), None, "{k}");
                        assert_eq!(scan_stream(&pairs, &[v]), None, "{k}");
                        let hdr = contains(v, b"Tk7HdrSecretValue9Q2w");
                        if hdr && !contains(data, b"Tk7HdrSecretValue9Q2w") {
                            assert_eq!(k, "authorization");
                            assert!(injected.iter().any(|s| s == "API"));
                        }
                        if !contains(data, b"Tk7QrySecretValue8R3e") {
                            assert!(!contains(v, b"Tk7QrySecretValue8R3e"), "{k}");
                        }
                    }
                    if !contains(data, b"Tk7HdrSecretValue9Q2w") {
                        assert!(!contains(target.as_bytes(), b"Tk7HdrSecretValue9Q2w"));
                    }
                    if host != "api.example" {
                        assert!(injected.is_empty(), "{injected:?} on {host}");
                    }
                }
                Substituted::Refused(_) | Substituted::NotARequest => {}
            }
        }
    }
});
