//! Secret redaction: every occurrence of a declared secret's value, in any string of a record
//! (keys included), becomes `[REDACTED:NAME]`.
//!
//! Besides the raw value, the common encodings a tool might echo are matched too: base64
//! (standard and URL-safe, with and without padding), hex (lower and upper case) and
//! percent-encoding. Only whole encodings of the value are matched: base64 of the value at a
//! different alignment inside a longer base64 string is not.

use serde_json::Value;

/// A declared secret: its name (shown in the redaction marker) and its value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub name: String,
    pub value: String,
}

impl Secret {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Secret {
            name: name.into(),
            value: value.into(),
        }
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the value, not even in a debug dump.
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<hidden>")
            .finish()
    }
}

const B64_STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const B64_URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

pub(crate) fn base64(data: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..4 {
            if i < chars {
                out.push(char::from(alphabet[((n >> (18 - 6 * i)) & 63) as usize]));
            } else if pad {
                out.push('=');
            }
        }
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A compiled set of patterns, longest first.
#[derive(Clone)]
pub(crate) struct Redactor {
    patterns: Vec<(String, String)>,
    /// First bytes of all patterns: a quick reject for every other position.
    first: [bool; 256],
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor {
            patterns: Vec::new(),
            first: [false; 256],
        }
    }
}

impl Redactor {
    pub(crate) fn new(secrets: &[Secret]) -> Self {
        let mut patterns: Vec<(String, String)> = Vec::new();
        for s in secrets.iter().filter(|s| !s.value.is_empty()) {
            let marker = format!("[REDACTED:{}]", s.name);
            let v = s.value.as_bytes();
            let forms = [
                s.value.clone(),
                base64(v, B64_STD, true),
                base64(v, B64_STD, false),
                base64(v, B64_URL, true),
                base64(v, B64_URL, false),
                hex::encode(v),
                hex::encode_upper(v),
                percent_encode(&s.value),
            ];
            for f in forms {
                if !patterns.iter().any(|(p, _)| *p == f) {
                    patterns.push((f, marker.clone()));
                }
            }
        }
        patterns.sort_by_key(|p| std::cmp::Reverse(p.0.len()));
        let mut first = [false; 256];
        for (p, _) in &patterns {
            first[usize::from(p.as_bytes()[0])] = true;
        }
        Redactor { patterns, first }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// One left-to-right scan; the longest pattern at a position wins; replaced text is not
    /// scanned again.
    pub(crate) fn redact_str(&self, s: &str) -> Option<String> {
        let b = s.as_bytes();
        let mut out: Option<String> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < b.len() {
            if self.first[usize::from(b[i])]
                && let Some((p, m)) = self
                    .patterns
                    .iter()
                    .find(|(p, _)| b[i..].starts_with(p.as_bytes()))
            {
                let o = out.get_or_insert_with(|| String::with_capacity(s.len()));
                // `i` is a char boundary: a pattern's first byte is never a UTF-8
                // continuation byte, so a match can only start at the start of a char.
                o.push_str(&s[copied..i]);
                o.push_str(m);
                i += p.len();
                copied = i;
                continue;
            }
            i += 1;
        }
        out.map(|mut o| {
            o.push_str(&s[copied..]);
            o
        })
    }

    /// Redact every string and key in a JSON value.
    pub(crate) fn redact_value(&self, v: &mut Value) {
        match v {
            Value::String(s) => {
                if let Some(r) = self.redact_str(s) {
                    *s = r;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.redact_value(x)),
            Value::Object(m) => {
                let old = std::mem::take(m);
                for (k, mut x) in old {
                    self.redact_value(&mut x);
                    m.insert(self.redact_str(&k).unwrap_or(k), x);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_known_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
        ] {
            assert_eq!(base64(i.as_bytes(), B64_STD, true), o);
        }
        assert_eq!(base64(&[0xfb, 0xff], B64_URL, false), "-_8");
        assert_eq!(base64(&[0xfb, 0xff], B64_STD, true), "+/8=");
    }

    #[test]
    fn all_forms_are_redacted() {
        let r = Redactor::new(&[Secret::new("TOKEN", "s3cr3t/v@lue")]);
        for form in [
            "s3cr3t/v@lue".to_owned(),
            base64(b"s3cr3t/v@lue", B64_STD, true),
            hex::encode("s3cr3t/v@lue"),
            hex::encode_upper("s3cr3t/v@lue"),
            "s3cr3t%2Fv%40lue".to_owned(),
        ] {
            let got = r.redact_str(&format!("x={form};")).unwrap();
            assert_eq!(got, "x=[REDACTED:TOKEN];", "form {form}");
        }
        assert_eq!(r.redact_str("nothing here"), None);
    }

    #[test]
    fn longest_match_wins_and_output_is_not_rescanned() {
        let r = Redactor::new(&[
            Secret::new("A", "abc"),
            Secret::new("B", "abcdef"),
            Secret::new("C", "RED"),
        ]);
        assert_eq!(
            r.redact_str("abcdef abc").unwrap(),
            "[REDACTED:B] [REDACTED:A]"
        );
        // The marker contains "RED" but is not scanned again.
        assert_eq!(r.redact_str("abc").unwrap(), "[REDACTED:A]");
    }

    #[test]
    fn debug_hides_the_value() {
        assert!(!format!("{:?}", Secret::new("N", "hunter2")).contains("hunter2"));
    }
}
