//! Fuzz the output gate: for any bytes and any policy variant, it never panics, never
//! exceeds the cap, never emits a forbidden character, and its wrapped rendering has exactly
//! one open and one close marker carrying the result's nonce.
#![no_main]

use cordon_gate::{Gate, GatePolicy, Gated, OutputKind, Overflow, StripPolicy, ToolMeta, gate_error};
use libfuzzer_sys::fuzz_target;

const META: ToolMeta<'static> = ToolMeta { tool: "fuzz", profile: "P1" };

fn forbidden(c: char) -> bool {
    matches!(c,
        '\u{0}'..='\u{8}' | '\u{B}'..='\u{1F}' | '\u{7F}'..='\u{9F}'
        | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}'
        | '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}' | '\u{180E}'
        | '\u{E0000}'..='\u{E007F}')
}

fn check(g: &Gated, max_bytes: u64) {
    assert!(g.envelope.bytes_out <= max_bytes, "{} > {max_bytes}", g.envelope.bytes_out);
    let text = g.content.to_text();
    if let Some(c) = text.chars().find(|&c| forbidden(c)) {
        panic!("forbidden U+{:04X} in content", c as u32);
    }
    let w = g.render_wrapped();
    let lower = w.to_ascii_lowercase();
    assert_eq!(lower.matches("<untrusted-output").count(), 1, "open markers");
    assert_eq!(lower.matches("</untrusted-output").count(), 1, "close markers");
    let n = g.nonce();
    assert!(w.starts_with("<untrusted-output "));
    let open_end = w.find('>').unwrap_or(0);
    assert!(w[..open_end].contains(&format!(" nonce=\"{n}\"")));
    assert!(w.ends_with(&format!("\n</untrusted-output nonce=\"{n}\">")));
    assert_eq!(w.matches(n).count(), 2);
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, input)) = data.split_first() else {
        return;
    };
    let strip = StripPolicy { html: selector & 1 != 0, markdown: selector & 2 != 0, ..StripPolicy::default() };
    let kind = if selector & 4 != 0 { OutputKind::Json } else { OutputKind::Text };
    let on_overflow = if selector & 8 != 0 { Overflow::Fail } else { Overflow::Truncate };
    let max_bytes = 128 + u64::from(selector >> 4) * 64;
    let policy = GatePolicy { kind, strip, on_overflow, max_bytes, ..GatePolicy::default() };
    let gate = Gate::new(policy).expect("valid policy");
    match gate.check(&META, input) {
        Ok(g) => check(&g, max_bytes),
        Err(refusal) => {
            // A refusal never quotes the output: no forbidden characters in its message.
            let msg = refusal.to_string();
            assert!(!msg.chars().any(forbidden), "refusal message carries a forbidden char");
            // Only JSON or the fail policy may refuse.
            assert!(kind == OutputKind::Json || on_overflow == Overflow::Fail, "{msg}");
        }
    }
    check(&gate.gate_error(&META, input), max_bytes.min(cordon_gate::ERROR_MAX_BYTES));
    check(&gate_error(&META, input), cordon_gate::ERROR_MAX_BYTES);
});
