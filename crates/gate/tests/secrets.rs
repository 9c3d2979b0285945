//! The gate's secret scans: the session's live tokens (always) and
//! well-known secret formats (`block_secrets`). Every fake secret here is
//! built at run time, so that the repository holds no string that looks
//! like a real one.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use cordon_gate::{Content, Gate, GatePolicy, LiveTokens, OutputKind, ToolMeta};
use serde_json::json;

const META: ToolMeta<'static> = ToolMeta {
    tool: "t",
    profile: "P2",
};

fn token() -> String {
    // With characters JSON and percent-encoding escape.
    ["tok", "/9f8e7d6c5b4a3921", "+\"q\"", "=00aa11bb22cc"].concat()
}

const PH: &str = "cordon-ph-00112233445566778899aabbccddeeff";

fn tokens() -> LiveTokens {
    let t = token();
    LiveTokens::new([("API_TOKEN", t.as_str(), PH)])
}

fn gate(p: GatePolicy) -> Gate {
    Gate::new(p).unwrap()
}

fn text(g: &Gate, out: &[u8], t: &LiveTokens) -> (String, cordon_gate::Envelope) {
    let r = g.check_scanned(&META, out, t).unwrap();
    (r.content.as_text().unwrap().to_owned(), r.envelope)
}

fn json_escaped_all(s: &str) -> String {
    s.chars().map(|c| format!("\\u{:04x}", c as u32)).collect()
}

#[test]
fn a_live_token_is_replaced_by_the_placeholder_in_every_form() {
    let g = gate(GatePolicy::default());
    let t = tokens();
    let tok = token();
    let raw = format!("Authorization: Bearer {tok}\n");
    let (out, env) = text(&g, raw.as_bytes(), &t);
    assert_eq!(out, format!("Authorization: Bearer {PH}\n"));
    assert_eq!(env.tokens_replaced, vec!["API_TOKEN".to_string()]);
    assert!(
        env.warnings.iter().any(|w| w
            == "the live token of secret API_TOKEN was in the output: replaced by its placeholder"),
        "{:?}",
        env.warnings
    );
    let meta = env.to_mcp_meta();
    assert_eq!(meta["cordon/tokens_replaced"], json!(["API_TOKEN"]));

    // JSON-escaped, as a tool that prints JSON writes it.
    let doc = serde_json::to_string(&json!({"echo": tok})).unwrap();
    assert!(
        !doc.contains(&tok),
        "the escaped form differs from the raw one"
    );
    let (out, env) = text(&g, doc.as_bytes(), &t);
    assert_eq!(out, serde_json::to_string(&json!({"echo": PH})).unwrap());
    assert_eq!(env.tokens_replaced, vec!["API_TOKEN".to_string()]);
    // Every character as \u00XX.
    let (out, _) = text(&g, json_escaped_all(&tok).as_bytes(), &t);
    assert_eq!(out, json_escaped_all(PH));

    // base64 of the token with text around it, at each alignment.
    for prefix in ["", "a", "ab", "user:"] {
        let enc = STANDARD.encode(format!("{prefix}{tok}"));
        let (out, env) = text(&g, enc.as_bytes(), &t);
        assert_eq!(
            env.tokens_replaced,
            vec!["API_TOKEN".to_string()],
            "{prefix:?}"
        );
        // The characters that carry only the token's bits are gone.
        assert!(!out.contains(&enc[4..enc.len() - 4]), "{out}");
    }

    // Percent-encoded.
    let pct: String = tok.bytes().map(|b| format!("%{b:02X}")).collect();
    let (out, env) = text(&g, format!("?t={pct}").as_bytes(), &t);
    assert!(!out.contains(&pct), "{out}");
    assert_eq!(env.tokens_replaced, vec!["API_TOKEN".to_string()]);
}

#[test]
fn invisible_characters_inside_a_token_do_not_hide_it() {
    let g = gate(GatePolicy::default());
    let tok = token();
    let (a, b) = tok.split_at(6);
    let hidden = format!("{a}\u{200b}{b}");
    let (out, env) = text(&g, hidden.as_bytes(), &tokens());
    assert_eq!(out, PH);
    assert_eq!(env.tokens_replaced, vec!["API_TOKEN".to_string()]);
}

#[test]
fn output_without_the_token_is_unchanged() {
    let g = gate(GatePolicy::default());
    let tok = token();
    // Positive control: the same text with the token gated by a gate that
    // does not know it passes unchanged; without the token it passes
    // unchanged under the scan too.
    let with = format!("value {tok}");
    let r = g.check(&META, with.as_bytes()).unwrap();
    assert_eq!(r.content.as_text(), Some(with.as_str()));
    assert!(r.envelope.tokens_replaced.is_empty());
    let near = format!("value {}", &tok[..tok.len() - 1]);
    let (out, env) = text(&g, near.as_bytes(), &tokens());
    assert_eq!(out, near);
    assert!(env.tokens_replaced.is_empty());
    assert!(env.warnings.is_empty(), "{:?}", env.warnings);
    assert!(env.to_mcp_meta().get("cordon/tokens_replaced").is_none());
}

#[test]
fn json_results_binary_results_and_error_messages_are_scanned() {
    let tok = token();
    let t = tokens();
    // JSON: in a value and in a key; the schema sees the placeholder.
    let g = gate(GatePolicy {
        kind: OutputKind::Json,
        schema: Some(json!({"type": "object", "properties": {"t": {"const": PH}}})),
        ..GatePolicy::default()
    });
    let doc = serde_json::to_vec(&json!({"t": tok, tok.clone(): 1})).unwrap();
    let r = g.check_scanned(&META, &doc, &t).unwrap();
    assert_eq!(r.content, Content::Json(json!({"t": PH, PH: 1})));
    assert_eq!(r.envelope.tokens_replaced, vec!["API_TOKEN".to_string()]);
    assert_eq!(r.envelope.schema_valid, Some(true));

    // Binary: the one alteration of binary output.
    let g = gate(GatePolicy {
        kind: OutputKind::Binary,
        media_type: Some("application/octet-stream".into()),
        ..GatePolicy::default()
    });
    let bytes = [b"\x00\x01".as_slice(), tok.as_bytes(), b"\xff"].concat();
    let r = g.check_scanned(&META, &bytes, &t).unwrap();
    let Content::Binary { bytes: out, .. } = r.content else {
        panic!("not binary");
    };
    assert_eq!(
        out,
        [b"\x00\x01".as_slice(), PH.as_bytes(), b"\xff"].concat()
    );
    assert_eq!(r.envelope.bytes_out, out.len() as u64);

    // A tool error message.
    let g = gate(GatePolicy::default());
    let e = g.gate_error_scanned(&META, format!("failed with {tok}").as_bytes(), &t);
    assert_eq!(
        e.content.as_text(),
        Some(format!("failed with {PH}").as_str())
    );
    assert_eq!(e.envelope.tokens_replaced, vec!["API_TOKEN".to_string()]);
}

#[test]
fn a_token_across_the_cap_is_replaced_before_the_cut() {
    let g = gate(GatePolicy {
        max_bytes: 160,
        on_overflow: cordon_gate::Overflow::Truncate,
        ..GatePolicy::default()
    });
    let tok = token();
    let out = format!("{}{tok}{}", "x".repeat(90), "y".repeat(200));
    let (text, env) = text(&g, out.as_bytes(), &tokens());
    assert!(env.truncated);
    assert_eq!(env.tokens_replaced, vec!["API_TOKEN".to_string()]);
    // Not even the token's start survives the cut.
    assert!(!text.contains(&tok[..8]), "{text}");
}

/// Realistic fake secrets of each rule, and a near miss of each.
fn fakes() -> Vec<(&'static str, String, String)> {
    let alnum36: String = "aB3dE5fG7hJ9kL2mN4pQ6rS8tV1wX3yZ5bC7d"
        .chars()
        .take(36)
        .collect();
    let pem_body = STANDARD.encode((0u8..96).collect::<Vec<u8>>());
    vec![
        (
            "private-key",
            format!(
                "-----BEGIN {k}-----\n{pem_body}\n-----END {k}-----",
                k = ["RSA ", "PRIVATE", " KEY"].concat()
            ),
            format!(
                "-----BEGIN {k}-----\n{pem_body}\n-----END {k}-----",
                k = "PUBLIC KEY"
            ),
        ),
        (
            "aws-access-key-id",
            ["AK", "IA", "Z3QXJ7M2LPW4N5R6"].concat(),
            // 0 is not a base32 digit.
            ["AK", "IA", "Z3QXJ7M2LPW4N5R0"].concat(),
        ),
        (
            "github-token",
            ["gh", "p_", &alnum36].concat(),
            ["gh", "p_", &alnum36[..35]].concat(),
        ),
        (
            "github-token",
            ["github", "_pat_", "11AB2CD3E0", &"x9Y8z7".repeat(12)].concat(),
            ["github", "_pat_", "11AB2CD3E0", "short"].concat(),
        ),
        (
            "slack-token",
            [
                "xo",
                "xb-",
                "123456789012-",
                "1234567890123-",
                "AbCdEfGhIjKlMnOpQrStUvWx",
            ]
            .concat(),
            ["xo", "xb-", "placeholder"].concat(),
        ),
        (
            "jwt",
            [
                "ey",
                "JhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.",
                "ey",
                "JzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvZSJ9.",
                "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
            ]
            .concat(),
            "abcdefghijkl.mnopqrstuvwx.yzABCDEFGHIJ".to_string(),
        ),
    ]
}

#[test]
fn secret_formats_are_redacted_only_when_the_tool_enables_it() {
    let on = gate(GatePolicy {
        block_secrets: true,
        ..GatePolicy::default()
    });
    let off = gate(GatePolicy::default());
    let none = LiveTokens::default();
    for (rule, secret, near) in fakes() {
        let out = format!("found: {secret} (end)");
        let (red, env) = text(&on, out.as_bytes(), &none);
        assert_eq!(red, format!("found: [REDACTED:{rule}] (end)"), "{rule}");
        assert_eq!(env.secrets_redacted.get(rule), Some(&1), "{rule}");
        assert!(
            env.warnings
                .iter()
                .any(|w| w == &format!("secret formats redacted from the output: {rule} (1)")),
            "{:?}",
            env.warnings
        );
        assert_eq!(env.to_mcp_meta()["cordon/secrets_redacted"][rule], 1);
        // Not enabled: unchanged.
        let (plain, env) = text(&off, out.as_bytes(), &none);
        assert_eq!(plain, out, "{rule}");
        assert!(env.secrets_redacted.is_empty());
        // A near miss: unchanged even when enabled.
        let miss = format!("found: {near} (end)");
        let (kept, env) = text(&on, miss.as_bytes(), &none);
        assert_eq!(kept, miss, "{rule}: near miss redacted");
        assert!(env.secrets_redacted.is_empty(), "{rule}");
    }
}

#[test]
fn secret_formats_in_json_strings_and_error_messages() {
    let key = ["AK", "IA", "Z3QXJ7M2LPW4N5R6"].concat();
    let g = gate(GatePolicy {
        kind: OutputKind::Json,
        block_secrets: true,
        ..GatePolicy::default()
    });
    let doc = serde_json::to_vec(&json!({"env": [format!("AWS_ACCESS_KEY_ID={key}")]})).unwrap();
    let r = g
        .check_scanned(&META, &doc, &LiveTokens::default())
        .unwrap();
    assert_eq!(
        r.content,
        Content::Json(json!({"env": ["AWS_ACCESS_KEY_ID=[REDACTED:aws-access-key-id]"]}))
    );
    let g = gate(GatePolicy {
        block_secrets: true,
        ..GatePolicy::default()
    });
    let e = g.gate_error_scanned(&META, key.as_bytes(), &LiveTokens::default());
    assert_eq!(e.content.as_text(), Some("[REDACTED:aws-access-key-id]"));
}

#[test]
fn a_live_token_is_named_as_such_even_when_it_has_a_known_format() {
    // The live-token scan runs first: the placeholder, not a redaction.
    let jwt = [
        "ey",
        "JhbGciOiJFUzI1NiJ9.",
        "ey",
        "JzY29wZSI6InJlYWQifQ.",
        "c2lnbmF0dXJlLWJ5dGVzLWhlcmU",
    ]
    .concat();
    let t = LiveTokens::new([("API_TOKEN", jwt.as_str(), PH)]);
    let g = gate(GatePolicy {
        block_secrets: true,
        ..GatePolicy::default()
    });
    let (out, env) = text(&g, format!("token={jwt}").as_bytes(), &t);
    assert_eq!(out, format!("token={PH}"));
    assert_eq!(env.tokens_replaced, vec!["API_TOKEN".to_string()]);
    assert!(env.secrets_redacted.is_empty());
}
