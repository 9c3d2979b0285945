//! Escaping of untrusted text for storage and display: nothing the tool wrote is ever
//! interpreted by a terminal reading the log.

use cordon_gate::is_stripped_char;

fn push_escaped(out: &mut String, c: char) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = write!(out, "\\u{{{:x}}}", c as u32);
}

/// Lossily decode `raw`, escape backslashes and every character the gate would strip
/// (controls other than `\n` and `\t`, bidi, zero-width, tags) as `\u{..}`, and cap the
/// result at `cap` bytes on a char boundary with a `…[+N bytes]` note.
pub fn escape_text(raw: &[u8], cap: usize) -> String {
    let text = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(text.len().min(cap) + 16);
    let mut consumed = 0;
    let mut piece = String::new();
    for c in text.chars() {
        piece.clear();
        match c {
            '\\' => piece.push_str("\\\\"),
            c if is_stripped_char(c) => push_escaped(&mut piece, c),
            c => piece.push(c),
        }
        if out.len() + piece.len() > cap {
            break;
        }
        out.push_str(&piece);
        consumed += c.len_utf8();
    }
    if consumed < text.len() {
        out.push_str(&format!("…[+{} bytes]", text.len() - consumed));
    }
    out
}

/// One-line form of stored text for `render_line`: additionally escapes `\n`, `\t` and `"`.
pub fn escape_inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if is_stripped_char(c) => push_escaped(&mut out, c),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_invisibles_are_escaped_not_kept() {
        let s = escape_text(
            "a\x1b[31mb\r\n\u{202E}c\u{200B}\\d\u{E0041}\x00".as_bytes(),
            1000,
        );
        assert_eq!(
            s,
            "a\\u{1b}[31mb\\u{d}\n\\u{202e}c\\u{200b}\\\\d\\u{e0041}\\u{0}"
        );
    }

    #[test]
    fn invalid_utf8_is_replaced_and_text_capped() {
        assert_eq!(escape_text(b"ok\xff", 100), "ok\u{FFFD}");
        let s = escape_text("é".repeat(100).as_bytes(), 11);
        assert_eq!(s, "ééééé…[+190 bytes]");
    }

    #[test]
    fn inline_escapes_newlines_and_quotes() {
        assert_eq!(escape_inline("a\nb\t\"c\"\x07"), "a\\nb\\t\\\"c\\\"\\u{7}");
    }
}
