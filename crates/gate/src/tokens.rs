//! A session's live tokens, looked for in bytes on their way somewhere
//! they must not go, in every form those bytes can carry them, and each
//! occurrence replaced by the same form of the session's placeholder.
//!
//! Two places use it: the egress door (`cordon-egress`) on every response
//! of a bound endpoint, as it streams, before a byte reaches the sandbox (a
//! debugging endpoint, an error page or OAuth introspection may quote the
//! request and the real token the door substituted); and the output gate
//! on every result and error message, before it reaches the model
//! ([`crate::Gate::check_scanned`]).
//!
//! The forms: as it is; JSON-escaped (`\"`, `\\`, control characters,
//! with and without `\/`, and every character as `\u00XX` in either hex
//! case); percent-encoded (reserved characters or every byte, either hex
//! case); base64 of either alphabet at each of the three alignments. For
//! base64 the characters that carry only token bits must match exactly,
//! and the one or two characters it shares with its neighbours must agree
//! in the token's bits; the replacement keeps the neighbours' bits, so a
//! rendering whose token and placeholder lengths agree modulo 3 still
//! decodes to the neighbours and the placeholder.
//!
//! The scan is streaming: the end of each chunk (the longest form less one
//! byte) is held back until the next chunk or the end, so a form split
//! across reads or frames is found.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use zeroize::Zeroizing;

/// Position marker: the byte must equal the pattern byte.
const EXACT: u8 = 0xFF;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Alphabet {
    Standard,
    UrlSafe,
}

impl Alphabet {
    fn value(self, c: u8) -> Option<u8> {
        match c {
            b'A'..=b'Z' => Some(c - b'A'),
            b'a'..=b'z' => Some(c - b'a' + 26),
            b'0'..=b'9' => Some(c - b'0' + 52),
            b'+' if self == Alphabet::Standard => Some(62),
            b'/' if self == Alphabet::Standard => Some(63),
            b'-' if self == Alphabet::UrlSafe => Some(62),
            b'_' if self == Alphabet::UrlSafe => Some(63),
            _ => None,
        }
    }

    fn char(self, v: u8) -> u8 {
        let v = v & 0x3F;
        match v {
            0..=25 => b'A' + v,
            26..=51 => b'a' + v - 26,
            52..=61 => b'0' + v - 52,
            62 if self == Alphabet::Standard => b'+',
            63 if self == Alphabet::Standard => b'/',
            62 => b'-',
            _ => b'_',
        }
    }
}

/// One form of one token, and the same form of its placeholder.
struct Pattern {
    secret: usize,
    /// Per position: the byte, or for a base64 character shared with a
    /// neighbour, the value of the token's bits in it.
    bytes: Zeroizing<Vec<u8>>,
    /// Per position: [`EXACT`], or the mask of the token's bits (6-bit
    /// base64 value) of a shared character.
    masks: Vec<u8>,
    /// The run of exact positions searched for first.
    anchor: (usize, usize),
    alphabet: Option<Alphabet>,
    /// The placeholder in the same form (masks as for `bytes`).
    rep: Vec<u8>,
    rep_masks: Vec<u8>,
}

impl Pattern {
    fn exact(secret: usize, token: Vec<u8>, rep: Vec<u8>) -> Pattern {
        let n = token.len();
        let rn = rep.len();
        Pattern {
            secret,
            bytes: Zeroizing::new(token),
            masks: vec![EXACT; n],
            anchor: (0, n),
            alphabet: None,
            rep,
            rep_masks: vec![EXACT; rn],
        }
    }

    fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Does the pattern match `hay` at `at`?
    fn matches(&self, hay: &[u8], at: usize) -> bool {
        let Some(w) = hay.get(at..at + self.len()) else {
            return false;
        };
        w.iter()
            .zip(self.bytes.iter().zip(&self.masks))
            .all(|(c, (b, m))| {
                if *m == EXACT {
                    c == b
                } else {
                    self.alphabet
                        .and_then(|a| a.value(*c))
                        .is_some_and(|v| v & m == *b)
                }
            })
    }

    /// The replacement of the match `found` (the matched bytes).
    fn replacement(&self, found: &[u8], out: &mut Vec<u8>) {
        let Some(a) = self.alphabet else {
            out.extend_from_slice(&self.rep);
            return;
        };
        let last = self.rep.len().saturating_sub(1);
        for (i, (b, m)) in self.rep.iter().zip(&self.rep_masks).enumerate() {
            if *m == EXACT {
                out.push(*b);
                continue;
            }
            // A character shared with a neighbour: keep the neighbour's
            // bits of the matched character.
            let orig = if i == 0 {
                found.first()
            } else if i == last {
                found.last()
            } else {
                None
            };
            let orig_mask = if i == 0 {
                self.masks.first()
            } else {
                self.masks.last()
            };
            let keep = match (orig.and_then(|c| a.value(*c)), orig_mask) {
                (Some(v), Some(om)) if *om != EXACT => v & !om & !m,
                _ => 0,
            };
            out.push(a.char(keep | (b & m)));
        }
    }
}

/// Every form of every live token of a session, to be replaced.
#[derive(Default)]
pub struct Forms {
    secrets: Vec<String>,
    list: Vec<Pattern>,
    longest: usize,
}

impl Forms {
    /// Forms for `(secret name, token, placeholder)` triples.
    pub fn new<'a>(tokens: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Forms {
        let mut secrets: Vec<String> = Vec::new();
        let mut list: Vec<Pattern> = Vec::new();
        for (name, token, ph) in tokens {
            if token.is_empty() {
                continue;
            }
            let secret = match secrets.iter().position(|s| s == name) {
                Some(i) => i,
                None => {
                    secrets.push(name.to_string());
                    secrets.len() - 1
                }
            };
            let mut add = |p: Pattern| {
                if !list
                    .iter()
                    .any(|q| *q.bytes == *p.bytes && q.masks == p.masks)
                {
                    list.push(p);
                }
            };
            for f in text_forms() {
                add(Pattern::exact(secret, f(token), f(ph)));
            }
            for k in 0..3 {
                for a in [Alphabet::Standard, Alphabet::UrlSafe] {
                    if let Some(p) = base64_pattern(secret, token.as_bytes(), ph.as_bytes(), k, a) {
                        add(p);
                    }
                }
            }
        }
        let longest = list.iter().map(Pattern::len).max().unwrap_or(0);
        Forms {
            secrets,
            list,
            longest,
        }
    }

    /// `data` with every form replaced, when any was found, and the names
    /// of the secrets found (each once, in the order found).
    pub fn replace(&self, data: &[u8]) -> Option<(Vec<u8>, Vec<String>)> {
        let (out, found) = self.replace_all(data)?;
        Some((
            out,
            found.iter().map(|i| self.secret(*i).to_string()).collect(),
        ))
    }

    /// Nothing to look for.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The name of secret `i`.
    pub fn secret(&self, i: usize) -> &str {
        self.secrets.get(i).map(String::as_str).unwrap_or("")
    }

    /// The leftmost-longest non-overlapping matches in `hay`: (start,
    /// pattern index), in order.
    fn matches(&self, hay: &[u8]) -> Vec<(usize, usize)> {
        let mut all: Vec<(usize, usize, usize)> = Vec::new();
        for (pi, p) in self.list.iter().enumerate() {
            let (a, b) = p.anchor;
            let needle = &p.bytes[a..b];
            for at in memchr::memmem::find_iter(hay, needle) {
                if at >= a && p.matches(hay, at - a) {
                    all.push((at - a, p.len(), pi));
                }
            }
        }
        all.sort_by(|x, y| x.0.cmp(&y.0).then(y.1.cmp(&x.1)));
        let mut out = Vec::new();
        let mut next = 0;
        for (start, len, pi) in all {
            if start >= next {
                out.push((start, pi));
                next = start + len;
            }
        }
        out
    }

    /// `data` with every form replaced, when any was found, and the
    /// secrets found (a complete value: a header, a trailer).
    pub fn replace_all(&self, data: &[u8]) -> Option<(Vec<u8>, Vec<usize>)> {
        let mut r = Redactor::new(Arc::new(Forms::default()));
        let (out, found) = r.run(self, data, true);
        if found.is_empty() {
            None
        } else {
            Some((out, found))
        }
    }
}

impl std::fmt::Debug for Forms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secrets' names only: never a token or a form of one.
        f.debug_struct("Forms")
            .field("secrets", &self.secrets)
            .field("forms", &self.list.len())
            .finish()
    }
}

/// The text forms of a token: as it is, JSON-escaped, percent-encoded.
fn text_forms() -> [fn(&str) -> Vec<u8>; 9] {
    [
        |s| s.as_bytes().to_vec(),
        |s| json(s, false),
        |s| json(s, true),
        |s| json_all(s, false),
        |s| json_all(s, true),
        |s| percent(s, false, false),
        |s| percent(s, false, true),
        |s| percent(s, true, false),
        |s| percent(s, true, true),
    ]
}

fn json(s: &str, slash: bool) -> Vec<u8> {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if slash => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

fn json_all(s: &str, upper: bool) -> Vec<u8> {
    let mut out = String::with_capacity(s.len() * 6);
    for c in s.chars() {
        let mut units = [0u16; 2];
        for u in c.encode_utf16(&mut units) {
            if upper {
                out.push_str(&format!("\\u{:04X}", u));
            } else {
                out.push_str(&format!("\\u{:04x}", u));
            }
        }
    }
    out.into_bytes()
}

fn percent(s: &str, every: bool, upper: bool) -> Vec<u8> {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if !every && (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')) {
            out.push(b as char);
        } else if upper {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    out.into_bytes()
}

/// The characters of the base64 rendering of `raw` after `k` bytes (mod
/// 3) that carry its bits: (characters, per-character mask of its bits).
fn base64_span(raw: &[u8], k: usize, a: Alphabet) -> (Vec<u8>, Vec<u8>) {
    let mut data = Zeroizing::new(vec![0u8; k]);
    data.extend_from_slice(raw);
    let enc = Zeroizing::new(match a {
        Alphabet::Standard => STANDARD_NO_PAD.encode(&*data),
        Alphabet::UrlSafe => URL_SAFE_NO_PAD.encode(&*data),
    });
    let (lo, hi) = (8 * k, 8 * data.len());
    let mut chars = Vec::new();
    let mut masks = Vec::new();
    for (i, c) in enc.bytes().enumerate() {
        let mut m = 0u8;
        for bit in 6 * i..6 * i + 6 {
            if (lo..hi).contains(&bit) {
                m |= 1 << (5 - (bit - 6 * i));
            }
        }
        if m == 0 {
            continue;
        }
        if m == 0x3F {
            chars.push(c);
            masks.push(EXACT);
        } else {
            chars.push(a.value(c).unwrap_or(0) & m);
            masks.push(m);
        }
    }
    (chars, masks)
}

fn base64_pattern(
    secret: usize,
    token: &[u8],
    ph: &[u8],
    k: usize,
    a: Alphabet,
) -> Option<Pattern> {
    let (bytes, masks) = base64_span(token, k, a);
    let first = masks.iter().position(|m| *m == EXACT)?;
    let end = masks.iter().rposition(|m| *m == EXACT)? + 1;
    // Too short a run of exact characters would match by chance.
    if end - first < 4 {
        return None;
    }
    let (rep, rep_masks) = base64_span(ph, k, a);
    Some(Pattern {
        secret,
        bytes: Zeroizing::new(bytes),
        masks,
        anchor: (first, end),
        alphabet: Some(a),
        rep,
        rep_masks,
    })
}

/// A streaming replacement over one byte stream (a response body).
pub struct Redactor {
    forms: Arc<Forms>,
    /// The held-back end of the stream so far (may hold part of a token).
    tail: Zeroizing<Vec<u8>>,
    /// The secrets found so far, by index.
    found: Vec<usize>,
}

impl Redactor {
    pub fn new(forms: Arc<Forms>) -> Redactor {
        Redactor {
            forms,
            tail: Zeroizing::new(Vec::new()),
            found: Vec::new(),
        }
    }

    /// The next chunk: what may be passed on now.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        let forms = self.forms.clone();
        let (out, _) = self.run(&forms, chunk, false);
        out
    }

    /// The end of the stream: the rest.
    pub fn finish(&mut self) -> Vec<u8> {
        let forms = self.forms.clone();
        let (out, _) = self.run(&forms, &[], true);
        out
    }

    /// The secrets found so far.
    pub fn found(&self) -> Vec<String> {
        self.found
            .iter()
            .map(|i| self.forms.secret(*i).to_string())
            .collect()
    }

    fn run(&mut self, forms: &Forms, chunk: &[u8], last: bool) -> (Vec<u8>, Vec<usize>) {
        let mut buf = Zeroizing::new(std::mem::take(&mut *self.tail));
        buf.extend_from_slice(chunk);
        let keep = if last {
            0
        } else {
            forms.longest.saturating_sub(1)
        };
        // A match starting before `safe` lies wholly within `buf`; one
        // starting later waits for more bytes.
        let safe = buf.len().saturating_sub(keep);
        let mut out = Vec::with_capacity(buf.len());
        let mut pos = 0;
        let mut found = Vec::new();
        for (start, pi) in forms.matches(&buf) {
            if start >= safe {
                break;
            }
            let p = &forms.list[pi];
            out.extend_from_slice(&buf[pos..start]);
            p.replacement(&buf[start..start + p.len()], &mut out);
            pos = start + p.len();
            if !found.contains(&p.secret) {
                found.push(p.secret);
            }
            if !self.found.contains(&p.secret) {
                self.found.push(p.secret);
            }
        }
        let cut = safe.max(pos);
        out.extend_from_slice(&buf[pos..cut]);
        self.tail = Zeroizing::new(buf[cut..].to_vec());
        (out, found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "real/token+\"x\"=9f8e7d6c5b4a3921";
    const PH: &str = "cordon-ph-Q7m2Xw9kLp3vZ8rT4nB6yH1s";

    fn forms() -> Arc<Forms> {
        Arc::new(Forms::new([
            ("API_TOKEN", TOKEN, PH),
            (
                "OTHER",
                "another-secret-token-42",
                "cordon-ph-zzzzzzzzzzzzzzzzzzzz",
            ),
        ]))
    }

    fn stream(f: &Arc<Forms>, data: &[u8], size: usize) -> (Vec<u8>, Vec<String>) {
        let mut r = Redactor::new(f.clone());
        let mut out = Vec::new();
        for c in data.chunks(size.max(1)) {
            out.extend(r.feed(c));
        }
        out.extend(r.finish());
        (out, r.found())
    }

    /// Every rendering of the token a response may carry, each with some
    /// text around it.
    fn renderings(token: &str) -> Vec<Vec<u8>> {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE};
        let mut v: Vec<Vec<u8>> = text_forms().iter().map(|f| f(token)).collect();
        for prefix in ["", "a", "ab", "abc", "Bearer ", "u:"] {
            for suffix in ["", "!", "?>", "xyz"] {
                let d = format!("{prefix}{token}{suffix}");
                for e in [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
                    v.push(e.encode(d.as_bytes()).into_bytes());
                }
            }
        }
        v
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        memchr::memmem::find(hay, needle).is_some()
    }

    #[test]
    fn every_form_is_replaced_at_every_split() {
        let f = forms();
        for r in renderings(TOKEN) {
            let data = [b"{\"echo\":\"".as_slice(), &r, b"\"}"].concat();
            for size in [1usize, 2, 3, 5, 7, 13, 64, 4096] {
                let (out, found) = stream(&f, &data, size);
                assert_eq!(
                    found,
                    vec!["API_TOKEN".to_string()],
                    "{}",
                    String::from_utf8_lossy(&r)
                );
                for form in renderings(TOKEN) {
                    // The stable middle of every base64 rendering is gone.
                    let probe = if form.len() > 8 {
                        &form[2..form.len() - 2]
                    } else {
                        &form[..]
                    };
                    assert!(
                        !contains(&out, probe),
                        "left in {:?} (chunks of {size})",
                        String::from_utf8_lossy(&out)
                    );
                }
                assert!(
                    out.starts_with(b"{\"echo\":\""),
                    "{:?}",
                    String::from_utf8_lossy(&out)
                );
                assert!(out.ends_with(b"\"}"));
            }
        }
    }

    #[test]
    fn replaced_by_the_placeholder_in_the_same_form() {
        let f = forms();
        let (out, _) = stream(&f, format!("Authorization: Bearer {TOKEN}\n").as_bytes(), 3);
        assert_eq!(out, format!("Authorization: Bearer {PH}\n").into_bytes());
        let j = json(TOKEN, true);
        let (out, _) = stream(&f, &j, 1);
        assert_eq!(out, json(PH, true));
        let p = percent(TOKEN, false, true);
        let (out, _) = stream(&f, &p, 2);
        assert_eq!(out, percent(PH, false, true));
    }

    #[test]
    fn base64_keeps_its_neighbours_when_the_lengths_agree() {
        use base64::engine::general_purpose::STANDARD;
        // Token and placeholder lengths agree modulo 3 here.
        let token = "tok-0123456789abcdefghij";
        let ph = "cordon-ph-abcdefghijklmn";
        assert_eq!(token.len() % 3, ph.len() % 3);
        let f = Arc::new(Forms::new([("S", token, ph)]));
        for prefix in ["", "a", "ab", "bot:"] {
            let enc = STANDARD.encode(format!("{prefix}{token}!?"));
            let (out, found) = stream(&f, enc.as_bytes(), 5);
            assert_eq!(found, vec!["S".to_string()]);
            let dec = STANDARD.decode(&out).unwrap();
            assert_eq!(dec, format!("{prefix}{ph}!?").into_bytes(), "{prefix:?}");
        }
    }

    #[test]
    fn clean_text_passes_unchanged() {
        let f = forms();
        let data = b"HTTP/1.1 200 OK, nothing to see: real/token+ but not all of it".repeat(50);
        for size in [1, 7, 100, 10_000] {
            let (out, found) = stream(&f, &data, size);
            assert_eq!(out, data);
            assert!(found.is_empty());
        }
        assert!(f.replace_all(b"no token here").is_none());
    }

    #[test]
    fn whole_values() {
        let f = forms();
        let (v, found) = f
            .replace_all(format!("Bearer {TOKEN}, another-secret-token-42").as_bytes())
            .unwrap();
        assert_eq!(
            String::from_utf8(v).unwrap(),
            format!("Bearer {PH}, cordon-ph-zzzzzzzzzzzzzzzzzzzz")
        );
        assert_eq!(found.len(), 2);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        #[test]
        fn no_token_survives_any_split(
            pre in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            post in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            which in 0usize..64,
            cuts in proptest::collection::vec(1usize..50, 1..20),
        ) {
            let f = forms();
            let r = renderings(TOKEN);
            let form = &r[which % r.len()];
            let data = [pre.as_slice(), form, &post].concat();
            let mut red = Redactor::new(f.clone());
            let mut out = Vec::new();
            let mut at = 0;
            for c in cuts.iter().cycle() {
                if at >= data.len() { break; }
                let end = (at + c).min(data.len());
                out.extend(red.feed(&data[at..end]));
                at = end;
            }
            out.extend(red.finish());
            proptest::prop_assert!(!contains(&out, TOKEN.as_bytes()));
            let probe = &form[2..form.len() - 2];
            proptest::prop_assert!(!contains(&out, probe));
            proptest::prop_assert_eq!(red.found(), vec!["API_TOKEN".to_string()]);
        }

        #[test]
        fn redaction_does_not_depend_on_the_cuts(
            pre in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            post in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            which in 0usize..64,
            cuts in proptest::collection::vec(1usize..50, 1..20),
        ) {
            let f = forms();
            let r = renderings(TOKEN);
            let data = [pre.as_slice(), &r[which % r.len()], &post].concat();
            let (whole, _) = stream(&f, &data, data.len());
            let mut red = Redactor::new(f.clone());
            let mut out = Vec::new();
            let mut at = 0;
            for c in cuts.iter().cycle() {
                if at >= data.len() { break; }
                let end = (at + c).min(data.len());
                out.extend(red.feed(&data[at..end]));
                at = end;
            }
            out.extend(red.finish());
            proptest::prop_assert_eq!(&out, &whole);
            proptest::prop_assert!(!contains(&out, TOKEN.as_bytes()));
        }
    }
}
