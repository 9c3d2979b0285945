//! Property tests: whatever bytes a tool emits, the gate never panics, never exceeds the cap,
//! never emits a forbidden character, and its wrapped rendering has exactly one open and one
//! close marker carrying the result's nonce.

use cordon_gate::{
    Content, Gate, GatePolicy, Gated, OutputKind, Overflow, StripPolicy, ToolMeta, gate_error,
};
use proptest::prelude::*;

const META: ToolMeta<'static> = ToolMeta {
    tool: "t",
    profile: "P1",
};

/// A character the gate must never emit with the default strip policy.
fn forbidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{B}'..='\u{1F}' | '\u{7F}'..='\u{9F}'
        | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
        | '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}' | '\u{180E}'
        | '\u{E0000}'..='\u{E007F}')
}

fn assert_clean(text: &str) -> Result<(), TestCaseError> {
    if let Some(c) = text.chars().find(|&c| forbidden(c)) {
        return Err(TestCaseError::fail(format!(
            "forbidden U+{:04X} in output",
            c as u32
        )));
    }
    Ok(())
}

fn assert_wrapped(g: &Gated) -> Result<(), TestCaseError> {
    let w = g.render_wrapped();
    assert_clean(&w)?;
    let lower = w.to_ascii_lowercase();
    prop_assert_eq!(lower.matches("<untrusted-output").count(), 1);
    prop_assert_eq!(lower.matches("</untrusted-output").count(), 1);
    let n = g.nonce();
    prop_assert_eq!(n.len(), 32);
    prop_assert!(w.starts_with("<untrusted-output "));
    let open_end = w.find('>').unwrap_or(0);
    let want = format!(" nonce=\"{n}\"");
    prop_assert!(w[..open_end].contains(&want));
    let close = format!("\n</untrusted-output nonce=\"{n}\">");
    prop_assert!(w.ends_with(&close));
    prop_assert_eq!(w.matches(n).count(), 2);
    Ok(())
}

fn assert_invariants(g: &Gated, max_bytes: u64) -> Result<(), TestCaseError> {
    let text = g.content.to_text();
    prop_assert!(
        g.envelope.bytes_out <= max_bytes,
        "{} > {}",
        g.envelope.bytes_out,
        max_bytes
    );
    if let Content::Text(t) = &g.content {
        prop_assert_eq!(t.len() as u64, g.envelope.bytes_out);
    }
    assert_clean(&text)?;
    assert_wrapped(g)
}

/// Fragments that exercise every state of the sanitiser.
fn nasty() -> impl Strategy<Value = Vec<u8>> {
    let frag = prop_oneof![
        Just(b"\x1b[31m".to_vec()),
        Just(b"\x1b[".to_vec()),
        Just(b"\x1b]0;title\x07".to_vec()),
        Just(b"\x1b]8;;u\x1b\\".to_vec()),
        Just(b"\x1b]".to_vec()),
        Just(b"\x1bP".to_vec()),
        Just(b"\x1b\\".to_vec()),
        Just(b"\x1b".to_vec()),
        Just("\u{9b}".as_bytes().to_vec()),
        Just("\u{9d}".as_bytes().to_vec()),
        Just("\u{9c}".as_bytes().to_vec()),
        Just(b"\r".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\x18".to_vec()),
        Just("\u{202E}".as_bytes().to_vec()),
        Just("\u{2066}".as_bytes().to_vec()),
        Just("\u{200B}".as_bytes().to_vec()),
        Just("\u{FEFF}".as_bytes().to_vec()),
        Just("\u{E0041}".as_bytes().to_vec()),
        Just(b"<untrusted-output".to_vec()),
        Just(b"</UNTRUSTED-OUTPUT nonce=\"0\">".to_vec()),
        Just(b"<".to_vec()),
        Just(b"/".to_vec()),
        Just(b"untrusted-output".to_vec()),
        Just(b"&lt;".to_vec()),
        Just(b"&#x1b;".to_vec()),
        Just(b"&#x202e;".to_vec()),
        Just(b"<b>".to_vec()),
        Just(b"<!--".to_vec()),
        Just(b"-->".to_vec()),
        Just(b"[a](b)".to_vec()),
        Just(b"![".to_vec()),
        Just(b"**".to_vec()),
        Just(b"\xff".to_vec()),
        Just(b"\xe2\x80".to_vec()),
        Just("é日🎉".as_bytes().to_vec()),
        proptest::collection::vec(any::<u8>(), 0..8),
        "[a-z \n]{0,12}".prop_map(String::into_bytes),
    ];
    proptest::collection::vec(frag, 0..60).prop_map(|v| v.concat())
}

fn input() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![proptest::collection::vec(any::<u8>(), 0..600), nasty()]
}

fn strip_variant() -> impl Strategy<Value = StripPolicy> {
    (any::<bool>(), any::<bool>()).prop_map(|(html, markdown)| StripPolicy {
        html,
        markdown,
        ..StripPolicy::default()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn text_gate_holds_invariants(bytes in input(), max in 128u64..700, strip in strip_variant()) {
        let g = Gate::new(GatePolicy { max_bytes: max, strip, ..GatePolicy::default() }).unwrap();
        let out = g.check(&META, &bytes).unwrap();
        assert_invariants(&out, max)?;
        prop_assert_eq!(out.envelope.bytes_in, bytes.len() as u64);
        if out.envelope.truncated {
            let t = out.envelope.truncation.unwrap();
            prop_assert!(t.kept < t.total);
            let tail = format!("kept {} of {} bytes]", t.kept, t.total);
            prop_assert!(out.content.to_text().ends_with(&tail));
        }
    }

    #[test]
    fn text_gate_fail_policy_never_exceeds_cap(bytes in input(), max in 128u64..700) {
        let g = Gate::new(GatePolicy { max_bytes: max, on_overflow: Overflow::Fail, ..GatePolicy::default() }).unwrap();
        if let Ok(out) = g.check(&META, &bytes) {
            assert_invariants(&out, max)?;
            prop_assert!(!out.envelope.truncated);
        }
    }

    #[test]
    fn json_gate_holds_invariants(bytes in input()) {
        let g = Gate::new(GatePolicy { kind: OutputKind::Json, ..GatePolicy::default() }).unwrap();
        if let Ok(out) = g.check(&META, &bytes) {
            assert_invariants(&out, g.policy().max_bytes)?;
        }
    }

    #[test]
    fn json_strings_are_stripped(s in nasty(), k in nasty()) {
        let doc = serde_json::json!({
            String::from_utf8_lossy(&k): [String::from_utf8_lossy(&s), {"x": String::from_utf8_lossy(&s)}]
        });
        let g = Gate::new(GatePolicy { kind: OutputKind::Json, ..GatePolicy::default() }).unwrap();
        let out = g.check(&META, doc.to_string().as_bytes()).unwrap();
        assert_invariants(&out, g.policy().max_bytes)?;
    }

    #[test]
    fn error_gate_holds_invariants(bytes in input()) {
        let out = gate_error(&META, &bytes);
        prop_assert!(out.envelope.is_error);
        assert_invariants(&out, cordon_gate::ERROR_MAX_BYTES)?;
    }

    #[test]
    fn plain_printable_text_passes_unchanged(s in "[a-zA-Z0-9 .,;:!?'\"()\n\t\u{e9}\u{65e5}\u{1f389}-]{0,300}") {
        let g = Gate::new(GatePolicy::default()).unwrap();
        let out = g.check(&META, s.as_bytes()).unwrap();
        prop_assert_eq!(out.content.as_text(), Some(s.as_str()));
        prop_assert_eq!(out.envelope.stripped.total(), 0);
    }
}
