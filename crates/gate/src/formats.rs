//! Well-known secret formats (`output: {block_secrets: true}`): text that
//! has the shape of a credential of a known kind is replaced by
//! `[REDACTED:RULE]`, whoever minted it. The live tokens of the session are
//! a separate, always-on scan ([`crate::tokens`]); these rules catch what
//! the broker never minted: a key file a tool read, a token in a page it
//! fetched.
//!
//! The rules follow gitleaks' shapes, narrowed to what has a fixed prefix
//! (so that text without it costs one literal search per rule). Word
//! boundaries are ASCII ones, which keep the `regex` crate on its DFA for
//! text in any script:
//!
//! | rule | shape |
//! |---|---|
//! | `private-key` | a PEM `-----BEGIN ... PRIVATE KEY-----` block through its `END` line (or to the end of the text) |
//! | `aws-access-key-id` | `AKIA`, `ASIA`, `ABIA`, `ACCA` or `A3T?` and 16 of `A-Z2-7`, as a whole word |
//! | `github-token` | `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_` and 36 alphanumerics; `github_pat_` and 82 of `A-Za-z0-9_` |
//! | `slack-token` | `xoxa-`, `xoxb-`, `xoxp-`, `xoxr-`, `xoxs-` and at least three dash-separated alphanumeric segments |
//! | `jwt` | three base64url segments, the first two starting `eyJ` (a JSON object), each at least 8 characters after it |

use std::collections::BTreeMap;
use std::sync::OnceLock;

use regex::Regex;

/// The rules, by name and pattern, in the order they are tried.
const RULES: [(&str, &str); 5] = [
    (
        "private-key",
        r"-----BEGIN[ A-Z0-9]{0,32}PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END[ A-Z0-9]{0,32}PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s:,.-]*)",
    ),
    (
        "aws-access-key-id",
        r"(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z2-7]{16}(?-u:\b)",
    ),
    (
        "github-token",
        r"(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})(?-u:\b)",
    ),
    (
        "slack-token",
        r"(?-u:\b)xox[abprs]-[A-Za-z0-9]{1,48}(?:-[A-Za-z0-9]{1,64}){2,}",
    ),
    (
        "jwt",
        r"(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    ),
];

/// The rules' names, for documentation and `cordon explain`.
pub fn rule_names() -> impl Iterator<Item = &'static str> {
    RULES.iter().map(|(n, _)| *n)
}

fn compiled() -> &'static [(&'static str, Option<Regex>)] {
    static RX: OnceLock<Vec<(&'static str, Option<Regex>)>> = OnceLock::new();
    RX.get_or_init(|| {
        // The patterns are constants tested below; a rule that did not
        // compile would be `None` and its test fails.
        RULES
            .iter()
            .map(|(name, p)| (*name, Regex::new(p).ok()))
            .collect()
    })
}

/// `text` with every match of every rule replaced by `[REDACTED:RULE]`,
/// when any matched, counting the matches per rule in `counts`. Matches of
/// different rules that overlap are replaced once, by the earliest (the
/// longest at the same start).
pub fn redact(text: &str, counts: &mut BTreeMap<String, u64>) -> Option<String> {
    let mut found: Vec<(usize, usize, &'static str)> = Vec::new();
    for (name, rx) in compiled() {
        if let Some(rx) = rx {
            found.extend(rx.find_iter(text).map(|m| (m.start(), m.end(), *name)));
        }
    }
    if found.is_empty() {
        return None;
    }
    found.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut out = String::with_capacity(text.len());
    let mut pos = 0;
    for (start, end, name) in found {
        if start < pos {
            continue;
        }
        out.push_str(&text[pos..start]);
        out.push_str("[REDACTED:");
        out.push_str(name);
        out.push(']');
        *counts.entry(name.to_owned()).or_insert(0) += 1;
        pos = end;
    }
    out.push_str(&text[pos..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_compiles() {
        for (name, rx) in compiled() {
            assert!(rx.is_some(), "rule {name} does not compile");
        }
    }

    fn one(text: &str) -> (String, BTreeMap<String, u64>) {
        let mut c = BTreeMap::new();
        let out = redact(text, &mut c).unwrap_or_else(|| text.to_owned());
        (out, c)
    }

    #[test]
    fn overlapping_matches_are_replaced_once() {
        // A JWT inside a PEM block: the block wins, as it starts first.
        let jwt = [
            "eyJ",
            "hbGciOiJIUzI1",
            ".eyJ",
            "zdWIiOiIxMjM0",
            ".",
            "c2lnbmF0dXJlX2hlcmU",
        ]
        .concat();
        let pem = format!(
            "-----BEGIN {}-----\n{jwt}\n-----END {}-----",
            "PRIVATE KEY", "PRIVATE KEY"
        );
        let (out, c) = one(&format!("a {pem} b"));
        assert_eq!(out, "a [REDACTED:private-key] b");
        assert_eq!(c.len(), 1);
    }
}
