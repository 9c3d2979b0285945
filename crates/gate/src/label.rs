//! Untrusted labelling: the wrapped text rendering, the JSON envelope rendering and the MCP
//! `_meta` object.

use serde_json::{Map, Value, json};

use crate::{Content, Envelope, Gated, LabelStyle};

/// Opening marker of the wrapped rendering (followed by attributes).
pub const MARKER_OPEN: &str = "<untrusted-output";
/// Closing marker of the wrapped rendering (followed by the nonce attribute).
pub const MARKER_CLOSE: &str = "</untrusted-output";
/// Key namespace of the MCP `_meta` object.
pub const META_PREFIX: &str = "cordon/";

pub(crate) const LABEL_OFF_WARNING: &str = "untrusted label disabled by policy: the content is not marked as untrusted in its text rendering";

/// 128 random bits, hex. If the system RNG fails (it does not on Linux ≥ 3.17 once booted),
/// fall back to a value derived from the clock and a counter: still unpredictable enough to
/// the content, which is fixed before the nonce is drawn, and the marker text inside the
/// content is neutralised regardless.
pub(crate) fn new_nonce() -> String {
    let mut buf = [0u8; 16];
    if getrandom::fill(&mut buf).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        buf[..8].copy_from_slice(&(t as u64).to_le_bytes());
        buf[8..].copy_from_slice(&n.to_le_bytes());
    }
    let mut s = String::with_capacity(32);
    for b in buf {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

/// An attribute value: only `[A-Za-z0-9_.:/+@-]`, everything else becomes `_`, at most 128
/// bytes. Tool and profile names come from the manifest, but the wrapper must stay parseable
/// whatever they are.
fn attr(s: &str) -> String {
    s.chars()
        .take(128)
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.:/+@-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

impl Gated {
    /// The per-result nonce used by [`Gated::render_wrapped`].
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// The content wrapped in nonce-tagged markers:
    ///
    /// ```text
    /// <untrusted-output tool="t" profile="P1" kind="text" nonce="…" truncated="false">
    /// content
    /// </untrusted-output nonce="…">
    /// ```
    ///
    /// The nonce is 128 random bits drawn after the content is fixed, and every occurrence of
    /// the marker text inside the content was neutralised by the gate, so the content can
    /// neither close the wrapper nor forge a new one.
    pub fn render_wrapped(&self) -> String {
        let e = &self.envelope;
        let body = self.content.to_text();
        let mut out = String::with_capacity(body.len() + 256);
        out.push_str(MARKER_OPEN);
        out.push_str(&format!(
            " tool=\"{}\" profile=\"{}\" kind=\"{}\"",
            attr(&e.tool),
            attr(&e.profile),
            e.kind.as_str()
        ));
        if let Some(m) = &e.media_type {
            out.push_str(&format!(" media_type=\"{}\"", attr(m)));
        }
        if e.is_error {
            out.push_str(" error=\"true\"");
        }
        out.push_str(&format!(
            " nonce=\"{}\" truncated=\"{}\">\n",
            self.nonce, e.truncated
        ));
        out.push_str(&body);
        if !body.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(MARKER_CLOSE);
        out.push_str(&format!(" nonce=\"{}\">", self.nonce));
        out
    }

    /// `{"envelope": {...}, "content": ...}`: content is a string for text, a JSON value for
    /// JSON, and `{"media_type", "bytes"}` (no data) for binary.
    pub fn render_envelope(&self) -> Value {
        let content = match &self.content {
            Content::Text(s) => Value::String(s.clone()),
            Content::Json(v) => v.clone(),
            Content::Binary { media_type, bytes } => {
                json!({"media_type": media_type, "bytes": bytes.len()})
            }
        };
        // Serialising a plain struct of strings, numbers and enums cannot fail.
        let envelope = serde_json::to_value(&self.envelope).unwrap_or(Value::Null);
        json!({"envelope": envelope, "content": content})
    }

    /// The rendering the policy's label style asks for: wrapped text, envelope JSON, or bare
    /// content (the envelope then carries a warning).
    pub fn render(&self) -> String {
        match self.envelope.label {
            LabelStyle::Wrapped => self.render_wrapped(),
            LabelStyle::Envelope => self.render_envelope().to_string(),
            LabelStyle::None => self.content.to_text(),
        }
    }
}

impl Envelope {
    /// The same facts as a flat MCP `_meta` object under the `cordon/` key namespace:
    /// `cordon/trust`, `cordon/tool`, `cordon/profile`, `cordon/kind`, `cordon/media_type`,
    /// `cordon/is_error`, `cordon/bytes_in`, `cordon/bytes_out`, `cordon/truncated`,
    /// `cordon/truncation`, `cordon/stripped` (non-zero classes only), `cordon/schema_valid`,
    /// `cordon/tokens_replaced` and `cordon/secrets_redacted` (when something was),
    /// `cordon/warnings`.
    pub fn to_mcp_meta(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(format!("{META_PREFIX}{k}"), v);
        };
        put("trust", json!("untrusted"));
        put("tool", json!(self.tool));
        put("profile", json!(self.profile));
        put("kind", json!(self.kind.as_str()));
        if let Some(mt) = &self.media_type {
            put("media_type", json!(mt));
        }
        put("is_error", json!(self.is_error));
        put("bytes_in", json!(self.bytes_in));
        put("bytes_out", json!(self.bytes_out));
        put("truncated", json!(self.truncated));
        if let Some(t) = &self.truncation {
            put("truncation", json!({"kept": t.kept, "total": t.total}));
        }
        let stripped: Map<String, Value> = self
            .stripped
            .nonzero()
            .map(|(k, n)| (k.to_owned(), json!(n)))
            .collect();
        put("stripped", Value::Object(stripped));
        put("schema_valid", json!(self.schema_valid));
        if !self.tokens_replaced.is_empty() {
            put("tokens_replaced", json!(self.tokens_replaced));
        }
        if !self.secrets_redacted.is_empty() {
            put("secrets_redacted", json!(self.secrets_redacted));
        }
        if !self.warnings.is_empty() {
            put("warnings", json!(self.warnings));
        }
        Value::Object(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_hex_and_differ() {
        let a = new_nonce();
        let b = new_nonce();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn attributes_cannot_break_out() {
        assert_eq!(attr("a\"b> <x"), "a_b___x");
        assert_eq!(attr("pdf_to-text.v2"), "pdf_to-text.v2");
    }
}
