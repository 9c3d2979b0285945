//! Finding placeholders where they are not bound: in a request target, a
//! header, a body or a raw byte stream, as written or encoded.
//!
//! Each placeholder is looked for as it is (ASCII case folded) and as every
//! base64 rendering of it (standard and URL-safe alphabets, each of the three
//! alignments: only the characters that do not depend on the neighbouring
//! bytes). Both in the bytes as they are and in the bytes after one pass of
//! percent-decoding (`%XX`) and JSON unescaping (`\uXXXX`, `\/` and the
//! other one-character escapes). The scan is streaming: a match split across
//! chunks (writes, body frames) is found, as is an escape split across them.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};

struct Needle {
    /// Index of the secret in [`Needles::secrets`].
    secret: usize,
    bytes: Vec<u8>,
    /// Compared with ASCII case folded (`bytes` is lower case).
    fold: bool,
}

/// What to look for, for every placeholder of a sandbox.
pub(crate) struct Needles {
    secrets: Vec<String>,
    list: Vec<Needle>,
    longest: usize,
}

impl Needles {
    /// Needles for `(secret name, placeholder)` pairs.
    pub(crate) fn new<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Needles {
        let mut secrets = Vec::new();
        let mut list = Vec::new();
        for (name, ph) in pairs {
            let secret = secrets.len();
            secrets.push(name.to_string());
            let raw = ph.as_bytes();
            if raw.is_empty() {
                continue;
            }
            list.push(Needle {
                secret,
                bytes: raw.to_ascii_lowercase(),
                fold: true,
            });
            for b in base64_needles(raw) {
                if !list
                    .iter()
                    .any(|n: &Needle| !n.fold && n.secret == secret && n.bytes == b)
                {
                    list.push(Needle {
                        secret,
                        bytes: b,
                        fold: false,
                    });
                }
            }
        }
        let longest = list.iter().map(|n| n.bytes.len()).max().unwrap_or(0);
        Needles {
            secrets,
            list,
            longest,
        }
    }

    /// True when there is nothing to look for.
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The first secret whose placeholder occurs in `hay` (no decoding).
    fn find_in(&self, hay: &[u8], folded: &[u8]) -> Option<&str> {
        self.list
            .iter()
            .find(|n| {
                let h = if n.fold { folded } else { hay };
                memchr::memmem::find(h, &n.bytes).is_some()
            })
            .map(|n| self.secrets[n.secret].as_str())
    }

    /// The first secret whose placeholder occurs in `data`, as it is or
    /// decoded (one complete piece of text: a header value, a target).
    pub(crate) fn find(self: &Arc<Self>, data: &[u8]) -> Option<String> {
        let mut s = Scanner::new(self.clone());
        s.feed(data).or_else(|| s.finish())
    }
}

/// The stable middle of each base64 rendering of `raw`.
fn base64_needles(raw: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for k in 0..3usize {
        let mut data = vec![0u8; k];
        data.extend_from_slice(raw);
        for enc in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
            let s = enc.encode(&data).into_bytes();
            // Characters that carry a bit of the k prefix bytes.
            let skip = (8 * k).div_ceil(6);
            // The last character carries bits of whatever follows unless
            // the data ends on a character boundary.
            let end = if (8 * data.len()) % 6 == 0 {
                s.len()
            } else {
                s.len() - 1
            };
            if end > skip + 3 {
                let n = s[skip..end].to_vec();
                if !out.contains(&n) {
                    out.push(n);
                }
            }
        }
    }
    out
}

/// A streaming scan of one byte stream.
pub(crate) struct Scanner {
    needles: Arc<Needles>,
    /// The end of the raw stream so far (at most `longest - 1` bytes).
    raw_tail: Vec<u8>,
    /// The end of the decoded stream so far.
    dec_tail: Vec<u8>,
    /// Undecided bytes of an escape begun at the end of the last chunk.
    pending: Vec<u8>,
}

impl Scanner {
    pub(crate) fn new(needles: Arc<Needles>) -> Scanner {
        Scanner {
            needles,
            raw_tail: Vec::new(),
            dec_tail: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Scan the next chunk: the secret whose placeholder has now appeared.
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Option<String> {
        if self.needles.is_empty() || chunk.is_empty() {
            return None;
        }
        let keep = self.needles.longest.saturating_sub(1);
        // Raw.
        let mut buf = std::mem::take(&mut self.raw_tail);
        buf.extend_from_slice(chunk);
        let hit = self.search(&buf);
        self.raw_tail = tail(buf, keep);
        if hit.is_some() {
            return hit;
        }
        // Decoded.
        let mut input = std::mem::take(&mut self.pending);
        input.extend_from_slice(chunk);
        let mut dec = std::mem::take(&mut self.dec_tail);
        self.pending = decode_into(&input, &mut dec, false);
        let hit = self.search(&dec);
        self.dec_tail = tail(dec, keep);
        hit
    }

    /// The end of the stream: decide any escape left open.
    pub(crate) fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let input = std::mem::take(&mut self.pending);
        let mut dec = std::mem::take(&mut self.dec_tail);
        let _ = decode_into(&input, &mut dec, true);
        self.search(&dec)
    }

    fn search(&self, buf: &[u8]) -> Option<String> {
        let folded = buf.to_ascii_lowercase();
        self.needles.find_in(buf, &folded).map(str::to_string)
    }
}

fn tail(mut v: Vec<u8>, keep: usize) -> Vec<u8> {
    if v.len() > keep {
        v.drain(..v.len() - keep);
    }
    v
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decode `%XX` and JSON escapes of `input` onto `out`; returns the bytes
/// of an escape that may still complete with the next chunk (none when
/// `last`).
fn decode_into(input: &[u8], out: &mut Vec<u8>, last: bool) -> Vec<u8> {
    let mut i = 0;
    while i < input.len() {
        let b = input[i];
        let rest = &input[i..];
        match b {
            b'%' => {
                if rest.len() < 3 && !last {
                    return rest.to_vec();
                }
                match (
                    rest.get(1).and_then(|b| hex(*b)),
                    rest.get(2).and_then(|b| hex(*b)),
                ) {
                    (Some(h), Some(l)) => {
                        out.push(h << 4 | l);
                        i += 3;
                    }
                    _ => {
                        out.push(b);
                        i += 1;
                    }
                }
            }
            b'\\' => {
                if rest.len() < 2 && !last {
                    return rest.to_vec();
                }
                match rest.get(1) {
                    Some(b'u') => {
                        if rest.len() < 6 && !last {
                            return rest.to_vec();
                        }
                        let digits = rest
                            .get(2..6)
                            .map(|d| d.iter().map(|b| hex(*b)).collect::<Option<Vec<u8>>>());
                        match digits.flatten() {
                            Some(d) => {
                                let cp = d.iter().fold(0u32, |a, x| a << 4 | u32::from(*x));
                                let c = char::from_u32(cp).unwrap_or('?');
                                let mut enc = [0u8; 4];
                                out.extend_from_slice(c.encode_utf8(&mut enc).as_bytes());
                                i += 6;
                            }
                            None => {
                                out.push(b);
                                i += 1;
                            }
                        }
                    }
                    Some(e @ (b'/' | b'\\' | b'"' | b'\'')) => {
                        out.push(*e);
                        i += 2;
                    }
                    Some(b'n') => {
                        out.push(b'\n');
                        i += 2;
                    }
                    Some(b'r') => {
                        out.push(b'\r');
                        i += 2;
                    }
                    Some(b't') => {
                        out.push(b'\t');
                        i += 2;
                    }
                    _ => {
                        out.push(b);
                        i += 1;
                    }
                }
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PH: &str = "cordon-ph-7Hq2xZ9pLw4vB8nK3mT6rY1sD5fG0jQe";

    fn needles() -> Arc<Needles> {
        Arc::new(Needles::new([
            ("JIRA_TOKEN", PH),
            ("OTHER", "cordon-ph-zzzzzzzzzzzzzzzzzzzzzzzz"),
        ]))
    }

    fn hit(data: &[u8]) -> Option<String> {
        needles().find(data)
    }

    #[test]
    fn clean_text_is_clean() {
        assert_eq!(hit(b"GET /rest/api?q=hello HTTP/1.1"), None);
        assert_eq!(hit(b"cordon-ph-7Hq2xZ9pLw4vB8nK3mT6rY1sD5fG0j"), None);
        assert_eq!(hit(b""), None);
    }

    #[test]
    fn found_as_written_and_case_folded() {
        assert_eq!(
            hit(format!("x={PH}&y").as_bytes()).as_deref(),
            Some("JIRA_TOKEN")
        );
        assert_eq!(
            hit(PH.to_ascii_uppercase().as_bytes()).as_deref(),
            Some("JIRA_TOKEN")
        );
    }

    #[test]
    fn found_percent_encoded_and_json_escaped() {
        let pct: String = PH.bytes().map(|b| format!("%{b:02X}")).collect();
        assert_eq!(hit(pct.as_bytes()).as_deref(), Some("JIRA_TOKEN"));
        let mixed: String = PH
            .bytes()
            .enumerate()
            .map(|(i, b)| {
                if i % 3 == 0 {
                    format!("%{b:02x}")
                } else {
                    (b as char).to_string()
                }
            })
            .collect();
        assert_eq!(hit(mixed.as_bytes()).as_deref(), Some("JIRA_TOKEN"));
        let json: String = PH.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        assert_eq!(
            hit(format!("{{\"a\":\"{json}\"}}").as_bytes()).as_deref(),
            Some("JIRA_TOKEN")
        );
    }

    #[test]
    fn found_base64_any_alignment_both_alphabets() {
        for prefix in ["", "a", "ab", "abc", "user:", "u:"] {
            let data = format!("{prefix}{PH}!?>");
            for enc in [
                base64::engine::general_purpose::STANDARD,
                base64::engine::general_purpose::URL_SAFE,
                base64::engine::general_purpose::STANDARD_NO_PAD,
            ] {
                let b = enc.encode(data.as_bytes());
                assert_eq!(
                    hit(b.as_bytes()).as_deref(),
                    Some("JIRA_TOKEN"),
                    "{prefix:?} {b}"
                );
                // Base64 then percent-encoded (a query parameter).
                let p = b
                    .replace('+', "%2B")
                    .replace('/', "%2F")
                    .replace('=', "%3D");
                assert_eq!(hit(p.as_bytes()).as_deref(), Some("JIRA_TOKEN"), "{p}");
            }
        }
    }

    #[test]
    fn found_split_across_chunks() {
        let json: String = PH.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
        let b64 = base64::engine::general_purpose::STANDARD.encode(format!("zz{PH}"));
        for data in [
            PH.to_string(),
            json,
            b64,
            PH.bytes().map(|b| format!("%{b:02X}")).collect(),
        ] {
            for size in [1usize, 2, 3, 5, 7, 13] {
                let mut s = Scanner::new(needles());
                let mut found = None;
                for c in data.as_bytes().chunks(size) {
                    if let Some(h) = s.feed(c) {
                        found = Some(h);
                        break;
                    }
                }
                let found = found.or_else(|| s.finish());
                assert_eq!(
                    found.as_deref(),
                    Some("JIRA_TOKEN"),
                    "{data} in chunks of {size}"
                );
            }
        }
    }

    #[test]
    fn each_secret_is_named() {
        assert_eq!(
            hit(b"..cordon-ph-zzzzzzzzzzzzzzzzzzzzzzzz..").as_deref(),
            Some("OTHER")
        );
    }

    /// Feed `data` cut after each of `cuts` (cycled), then finish.
    fn scan_cut(data: &[u8], cuts: &[usize]) -> Option<String> {
        let mut s = Scanner::new(needles());
        let mut at = 0;
        for c in cuts.iter().cycle() {
            if at >= data.len() {
                break;
            }
            let end = (at + c).min(data.len());
            if let Some(h) = s.feed(&data[at..end]) {
                return Some(h);
            }
            at = end;
        }
        s.finish()
    }

    /// Renderings of the placeholder the scanner must find.
    fn renderings() -> Vec<Vec<u8>> {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE};
        let mut v = vec![
            PH.as_bytes().to_vec(),
            PH.to_ascii_uppercase().into_bytes(),
            PH.bytes()
                .map(|b| format!("%{b:02X}"))
                .collect::<String>()
                .into_bytes(),
            PH.bytes()
                .map(|b| format!("%{b:02x}"))
                .collect::<String>()
                .into_bytes(),
            PH.chars()
                .map(|c| format!("\\u{:04x}", c as u32))
                .collect::<String>()
                .into_bytes(),
        ];
        for prefix in ["", "a", "ab", "user:"] {
            for e in [STANDARD, URL_SAFE] {
                v.push(e.encode(format!("{prefix}{PH}").as_bytes()).into_bytes());
            }
        }
        v
    }

    /// Bytes rich in what the decoder acts on.
    fn noisy() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        proptest::collection::vec(
            prop_oneof![
                Just(b'%'),
                Just(b'\\'),
                Just(b'u'),
                Just(b'0'),
                Just(b'a'),
                Just(b'F'),
                any::<u8>()
            ],
            0..60,
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        #[test]
        fn a_placeholder_is_found_however_the_stream_is_cut(
            pre in noisy(),
            post in noisy(),
            which in 0usize..64,
            cuts in proptest::collection::vec(1usize..40, 1..20),
        ) {
            let r = renderings();
            // After a backslash, the escape's own backslash is escaped: literal text (as
            // JSON reads it), not the placeholder.
            let mut pre = pre;
            if pre.last() == Some(&b'\\') {
                pre.push(b' ');
            }
            let data = [pre.as_slice(), &r[which % r.len()], &post].concat();
            proptest::prop_assert!(scan_cut(&data, &cuts).is_some());
        }

        #[test]
        fn the_verdict_does_not_depend_on_the_cuts(
            data in noisy(),
            cuts in proptest::collection::vec(1usize..10, 1..20),
        ) {
            proptest::prop_assert_eq!(scan_cut(&data, &cuts).is_some(), hit(&data).is_some());
        }
    }
}
