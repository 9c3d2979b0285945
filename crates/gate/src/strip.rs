//! The character-level sanitiser: one pass over the bytes, a small state machine for
//! terminal escape sequences, a lookup table for the fast path.
//!
//! What it removes (each class switchable in [`StripPolicy`]):
//! - `control`: C0 controls except `\n` and `\t`, DEL, C1 controls (U+0080..U+009F).
//!   Carriage returns are normalised: `\r\n` becomes `\n`, a lone `\r` becomes `\n` (a lone
//!   CR is how terminal output overwrites a line, which hides text from a human reviewer;
//!   turning it into a newline keeps every byte visible). Each `\r` is counted as `newline`.
//! - `ansi`: ANSI/VT escape sequences removed whole: CSI (`ESC [` or U+009B, parameters,
//!   intermediates, final byte), OSC (`ESC ]` or U+009D, terminated by BEL or ST), DCS
//!   (`ESC P` or U+0090), SOS/PM/APC (`ESC X`, `ESC ^`, `ESC _`, U+0098/U+009E/U+009F)
//!   terminated by ST (`ESC \` or U+009C), and two/three character escapes (`ESC x`,
//!   `ESC ( B`). A sequence that is still open at the end of the input is dropped up to the
//!   end, as a terminal would swallow it. CAN/SUB abort a sequence.
//! - `bidi`: U+202A..U+202E, U+2066..U+2069, U+200E, U+200F, U+061C.
//! - `zero_width`: U+200B..U+200D, U+2060..U+2064, U+206A..U+206F, U+FEFF, U+180E,
//!   U+FFF9..U+FFFB (the brief's list plus the other invisible format characters).
//! - `tags`: the tag block U+E0000..U+E007F.
//!
//! Invalid UTF-8 is replaced by U+FFFD, one per maximal invalid subsequence (as
//! `String::from_utf8_lossy` does), or rejected with its byte offset.

use serde::{Deserialize, Serialize};

use crate::{GateRefusal, StripPolicy, Utf8Policy};

/// What the gate removed or rewrote, per class. Character classes count characters,
/// `ansi` counts whole escape sequences, `html_tags` and `markdown` count constructs.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(default, deny_unknown_fields)]
pub struct StripCounts {
    pub control: u64,
    pub newline: u64,
    pub ansi: u64,
    pub bidi: u64,
    pub zero_width: u64,
    pub tags: u64,
    pub invalid_utf8: u64,
    pub html_tags: u64,
    pub html_entities: u64,
    pub markdown: u64,
    /// Occurrences of the wrapper's marker text neutralised inside the content.
    pub marker: u64,
}

impl StripCounts {
    /// `(class, count)` for every class, in a stable order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("control", self.control),
            ("newline", self.newline),
            ("ansi", self.ansi),
            ("bidi", self.bidi),
            ("zero_width", self.zero_width),
            ("tags", self.tags),
            ("invalid_utf8", self.invalid_utf8),
            ("html_tags", self.html_tags),
            ("html_entities", self.html_entities),
            ("markdown", self.markdown),
            ("marker", self.marker),
        ]
        .into_iter()
    }

    /// Only the classes with a non-zero count.
    pub fn nonzero(&self) -> impl Iterator<Item = (&'static str, u64)> {
        self.iter().filter(|(_, n)| *n != 0)
    }

    /// Sum over all classes.
    pub fn total(&self) -> u64 {
        self.iter().map(|(_, n)| n).sum()
    }
}

/// UTF-8 validation: the SIMD validator for the common (valid) case, the standard library's
/// for the position and length of an error.
pub(crate) fn utf8(b: &[u8]) -> Result<&str, std::str::Utf8Error> {
    match simdutf8::basic::from_utf8(b) {
        Ok(s) => Ok(s),
        Err(_) => std::str::from_utf8(b),
    }
}

/// Bytes that can be copied without looking at them: printable ASCII, `\n`, `\t`,
/// UTF-8 continuation bytes, and lead bytes that cannot start any character we strip.
/// Leads that can: 0xC2 (C1 controls), 0xD8 (U+061C), 0xE1 (U+180E), 0xE2 (U+200B..U+206F),
/// 0xEF (U+FEFF, U+FFF9..U+FFFB), 0xF3 (tags). Continuation bytes are only ever reached after
/// a plain lead, because the scan stops at every special lead.
const PLAIN: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0x20;
    while b < 0x7f {
        t[b] = true;
        b += 1;
    }
    t[b'\n' as usize] = true;
    t[b'\t' as usize] = true;
    let mut b = 0x80;
    while b < 0x100 {
        t[b] = !matches!(b, 0xC2 | 0xD8 | 0xE1 | 0xE2 | 0xEF | 0xF3);
        b += 1;
    }
    t
};

/// The end of the run of [`PLAIN`] bytes starting at `i`. Eight bytes at a time while they
/// are all printable ASCII (the common case), then byte by byte through the table.
#[inline]
fn plain_run(b: &[u8], mut i: usize) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    loop {
        while let Some(chunk) = b.get(i..i + 8) {
            let mut w = [0u8; 8];
            w.copy_from_slice(chunk);
            let x = u64::from_le_bytes(w);
            // Any byte >= 0x80, < 0x20, or == 0x7F stops the word-at-a-time scan.
            let high = x & HI;
            let low = x.wrapping_sub(LO * 0x20) & !x & HI;
            let y = x ^ (LO * 0x7F);
            let del = y.wrapping_sub(LO) & !y & HI;
            if high | low | del != 0 {
                break;
            }
            i += 8;
        }
        // Up to eight bytes through the table (newlines, tabs, plain UTF-8), then back to
        // the word-at-a-time scan.
        let end = b.len().min(i + 8);
        while i < end && PLAIN[b[i] as usize] {
            i += 1;
        }
        if i < end || i >= b.len() {
            return i;
        }
    }
}

pub(crate) fn is_bidi(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

pub(crate) fn is_zero_width(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200D}'
            | '\u{2060}'..='\u{2064}'
            | '\u{206A}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{180E}'
            | '\u{FFF9}'..='\u{FFFB}'
    )
}

pub(crate) fn is_tag(c: char) -> bool {
    matches!(c, '\u{E0000}'..='\u{E007F}')
}

/// C0 (except `\n`, `\t`), DEL and C1.
pub(crate) fn is_control(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{8}' | '\u{B}'..='\u{1F}' | '\u{7F}'..='\u{9F}')
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Ground,
    /// After ESC.
    Esc,
    /// `ESC` followed by intermediates (0x20..0x2F), waiting for a final byte.
    EscIntermediate,
    /// Inside a control sequence, waiting for a final byte (0x40..0x7E).
    Csi,
    /// Inside a string sequence (OSC, DCS, SOS, PM, APC); `bel` says BEL ends it (OSC).
    Str {
        bel: bool,
    },
    /// ESC seen inside a string sequence: `\` ends it, anything else starts a new escape.
    StrEsc,
}

pub(crate) struct Stripper<'a> {
    policy: &'a StripPolicy,
    state: State,
    after_cr: bool,
    pub(crate) counts: StripCounts,
    pub(crate) out: String,
}

impl<'a> Stripper<'a> {
    pub(crate) fn new(policy: &'a StripPolicy, capacity: usize) -> Self {
        Stripper {
            policy,
            state: State::Ground,
            after_cr: false,
            counts: StripCounts::default(),
            out: String::with_capacity(capacity),
        }
    }

    /// Sanitise raw bytes, decoding UTF-8 on the way.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8], utf8: Utf8Policy) -> Result<(), GateRefusal> {
        let mut rest = bytes;
        loop {
            match self::utf8(rest) {
                Ok(valid) => {
                    self.push_str(valid);
                    return Ok(());
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` marks the end of the longest valid prefix.
                    self.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    let offset = (bytes.len() - rest.len() + valid.len()) as u64;
                    if utf8 == Utf8Policy::Reject {
                        return Err(GateRefusal::InvalidUtf8 { offset });
                    }
                    self.counts.invalid_utf8 += 1;
                    self.feed('\u{FFFD}');
                    // `error_len` is None only for a truncated sequence at the very end.
                    let skip = e.error_len().unwrap_or(after.len());
                    rest = &after[skip..];
                }
            }
        }
    }

    /// Sanitise valid text.
    pub(crate) fn push_str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if self.state == State::Ground {
                if self.after_cr {
                    self.after_cr = false;
                    if bytes[i] == b'\n' {
                        i += 1;
                        continue;
                    }
                }
                let start = i;
                i = plain_run(bytes, i);
                if i > start {
                    // `start` and `i` are char boundaries: the scan starts at one and stops
                    // only at a non-continuation byte or the end.
                    self.out.push_str(&s[start..i]);
                }
                if i >= bytes.len() {
                    break;
                }
            }
            // ASCII needs no decoding (most of an escape sequence is ASCII).
            if bytes[i] < 0x80 {
                self.feed(char::from(bytes[i]));
                i += 1;
                continue;
            }
            let Some(c) = s[i..].chars().next() else {
                break;
            };
            i += c.len_utf8();
            self.feed(c);
        }
    }

    /// Finish: an unterminated sequence is dropped (it was counted when it began).
    pub(crate) fn finish(self) -> (String, StripCounts) {
        (self.out, self.counts)
    }

    fn begin(&mut self, state: State) {
        self.counts.ansi += 1;
        self.state = state;
    }

    fn feed(&mut self, c: char) {
        match self.state {
            State::Ground => self.ground(c),
            State::Esc => match c {
                '[' => self.state = State::Csi,
                ']' => self.state = State::Str { bel: true },
                'P' | 'X' | '^' | '_' => self.state = State::Str { bel: false },
                '\x20'..='\x2F' => self.state = State::EscIntermediate,
                '\x30'..='\x7E' => self.state = State::Ground,
                _ => {
                    self.state = State::Ground;
                    self.ground(c);
                }
            },
            State::EscIntermediate => match c {
                '\x20'..='\x2F' => {}
                '\x30'..='\x7E' => self.state = State::Ground,
                _ => {
                    self.state = State::Ground;
                    self.ground(c);
                }
            },
            State::Csi => match c {
                '\x20'..='\x3F' => {}
                '\x40'..='\x7E' => self.state = State::Ground,
                _ => {
                    self.state = State::Ground;
                    self.ground(c);
                }
            },
            State::Str { bel } => match c {
                '\x07' if bel => self.state = State::Ground,
                '\u{9C}' => self.state = State::Ground,
                '\x1B' => self.state = State::StrEsc,
                '\x18' | '\x1A' => self.state = State::Ground,
                _ => {}
            },
            State::StrEsc => {
                if c == '\\' {
                    self.state = State::Ground;
                } else {
                    // The ESC starts a new sequence; `c` belongs to it.
                    self.begin(State::Esc);
                    self.feed(c);
                }
            }
        }
    }

    fn ground(&mut self, c: char) {
        if self.after_cr {
            self.after_cr = false;
            if c == '\n' {
                return;
            }
        }
        let p = self.policy;
        if p.ansi {
            match c {
                '\x1B' => return self.begin(State::Esc),
                '\u{9B}' => return self.begin(State::Csi),
                '\u{9D}' => return self.begin(State::Str { bel: true }),
                '\u{90}' | '\u{98}' | '\u{9E}' | '\u{9F}' => {
                    return self.begin(State::Str { bel: false });
                }
                _ => {}
            }
        }
        if c == '\r' && p.control {
            self.counts.newline += 1;
            self.out.push('\n');
            self.after_cr = true;
        } else if p.control && is_control(c) {
            self.counts.control += 1;
        } else if p.bidi && is_bidi(c) {
            self.counts.bidi += 1;
        } else if p.zero_width && is_zero_width(c) {
            self.counts.zero_width += 1;
        } else if p.tags && is_tag(c) {
            self.counts.tags += 1;
        } else {
            self.out.push(c);
        }
    }
}

/// The wrapper's element name; occurrences inside content are neutralised.
pub(crate) const MARKER_NAME: &str = "untrusted-output";

/// Characters that could open a forged marker: `<` and its look-alikes.
fn is_opener(c: char) -> bool {
    matches!(
        c,
        '<' | '\u{FF1C}' | '\u{FE64}' | '\u{2039}' | '\u{2329}' | '\u{3008}' | '\u{27E8}'
    )
}

fn is_gap(c: char) -> bool {
    c.is_whitespace() || matches!(c, '/' | '\u{FF0F}' | '\u{2044}' | '\u{2215}')
}

/// Does `b` contain the marker name (ASCII case-insensitive)?
pub(crate) fn contains_marker_name(b: &[u8]) -> bool {
    let name = MARKER_NAME.as_bytes();
    let mut p = 9;
    while let Some(dash) = find_byte(b, p, b'-') {
        let i = dash - 9;
        if i + name.len() > b.len() {
            return false;
        }
        if b[i..i + name.len()].eq_ignore_ascii_case(name) {
            return true;
        }
        p = dash + 1;
    }
    false
}

/// Position of the first `needle` at or after `from`.
fn find_byte(b: &[u8], mut i: usize, needle: u8) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let pattern = LO * u64::from(needle);
    while let Some(chunk) = b.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let y = u64::from_le_bytes(w) ^ pattern;
        if y.wrapping_sub(LO) & !y & HI != 0 {
            break;
        }
        i += 8;
    }
    b.get(i..)?.iter().position(|&x| x == needle).map(|p| i + p)
}

/// Replace the opener of every `<untrusted-output` / `</untrusted-output` (ASCII case
/// insensitive, with whitespace or slashes between, `<` or a look-alike) with `&lt;`,
/// so content can never open or close the wrapper. Linear: each hit looks back at most
/// 64 characters.
pub(crate) fn neutralise_markers(s: String, counts: &mut StripCounts) -> String {
    let name = MARKER_NAME.as_bytes();
    let bytes = s.as_bytes();
    if bytes.len() < name.len() {
        return s;
    }
    let mut cuts: Vec<(usize, usize)> = Vec::new();
    // Every occurrence has its '-' at offset 9: find the dashes (eight bytes at a time), then
    // compare the sixteen bytes around each.
    const DASH: usize = 9;
    let mut p = DASH;
    while let Some(dash) = find_byte(bytes, p, b'-') {
        let i = dash - DASH;
        p = dash + 1;
        if dash + (name.len() - DASH) > bytes.len() {
            break;
        }
        if !bytes[i..i + name.len()].eq_ignore_ascii_case(name) {
            continue;
        }
        // Walk back over whitespace and slashes to the opener.
        let prev_end = cuts.last().map_or(0, |c| c.1);
        for (pos, c) in s[..i].char_indices().rev().take(64) {
            if pos < prev_end {
                break;
            }
            if is_opener(c) {
                cuts.push((pos, pos + c.len_utf8()));
                break;
            }
            if !is_gap(c) {
                break;
            }
        }
        p = i + name.len();
    }
    if cuts.is_empty() {
        return s;
    }
    counts.marker += cuts.len() as u64;
    let mut out = String::with_capacity(s.len() + 3 * cuts.len());
    let mut from = 0;
    for (a, b) in cuts {
        out.push_str(&s[from..a]);
        out.push_str("&lt;");
        from = b;
    }
    out.push_str(&s[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(input: &[u8]) -> (String, StripCounts) {
        let p = StripPolicy::default();
        let mut s = Stripper::new(&p, input.len());
        s.push_bytes(input, Utf8Policy::Replace).unwrap();
        s.finish()
    }

    #[test]
    fn plain_text_is_untouched() {
        let t = "hello, world\n\tindented — ünïcödé 日本語 🎉\n";
        let (out, c) = strip(t.as_bytes());
        assert_eq!(out, t);
        assert_eq!(c, StripCounts::default());
    }

    #[test]
    fn c0_and_c1_controls_are_removed_except_newline_and_tab() {
        let (out, c) = strip(b"a\x00b\x07c\x08d\x7fe\tf\ng\x0b\x0c\x1f");
        assert_eq!(out, "abcde\tf\ng");
        assert_eq!(c.control, 7);
        let (out, c) = strip("x\u{85}y\u{80}z\u{9a}".as_bytes());
        assert_eq!(out, "xyz");
        assert_eq!(c.control, 3);
    }

    #[test]
    fn carriage_returns_are_normalised() {
        let (out, c) = strip(b"a\r\nb\rc\r\r\nd\r");
        assert_eq!(out, "a\nb\nc\n\nd\n");
        assert_eq!(c.newline, 5);
        assert_eq!(c.control, 0);
    }

    #[test]
    fn csi_sequences_are_removed_whole() {
        let (out, c) = strip(b"\x1b[31mred\x1b[0m \x1b[1;2;3H\x1b[?25lok\x1b[2J");
        assert_eq!(out, "red ok");
        assert_eq!(c.ansi, 5);
        assert_eq!(c.control, 0);
        // 8-bit CSI in its UTF-8 form.
        let (out, c) = strip("a\u{9b}31mb".as_bytes());
        assert_eq!(out, "ab");
        assert_eq!(c.ansi, 1);
    }

    #[test]
    fn osc_sequences_with_bel_or_st_are_removed_whole() {
        let (out, c) =
            strip(b"\x1b]0;evil title\x07x\x1b]8;;http://e.example/\x1b\\link\x1b]8;;\x1b\\");
        assert_eq!(out, "xlink");
        assert_eq!(c.ansi, 3);
        let (out, c) = strip("a\u{9d}2;t\u{9c}b".as_bytes());
        assert_eq!(out, "ab");
        assert_eq!(c.ansi, 1);
    }

    #[test]
    fn dcs_sos_pm_apc_strings_are_removed_whole() {
        let (out, c) =
            strip(b"1\x1bPq#0;2;0;0;0\x1b\\2\x1bXsos\x1b\\3\x1b^pm\x1b\\4\x1b_apc\x1b\\5");
        assert_eq!(out, "12345");
        assert_eq!(c.ansi, 4);
        // BEL does not end a DCS: the string runs on to ST.
        let (out, _) = strip(b"a\x1bPdata\x07more\x1b\\b");
        assert_eq!(out, "ab");
    }

    #[test]
    fn single_and_intermediate_escapes_are_removed() {
        let (out, c) = strip(b"a\x1bcb\x1b(Bc\x1b7d\x1b#8e\x1b");
        assert_eq!(out, "abcde");
        assert_eq!(c.ansi, 5);
        assert_eq!(c.control, 0);
    }

    #[test]
    fn aborted_sequences_do_not_eat_text() {
        // A control character inside a CSI aborts it and is itself stripped.
        let (out, c) = strip(b"\x1b[12\x18visible");
        assert_eq!(out, "visible");
        assert_eq!(c.ansi, 1);
        assert_eq!(c.control, 1);
        // A non-ASCII char after ESC ends the escape and is kept.
        let (out, _) = strip("\x1bé".as_bytes());
        assert_eq!(out, "é");
        // ESC inside an OSC starts a new sequence.
        let (out, c) = strip(b"\x1b]0;t\x1b[31mred");
        assert_eq!(out, "red");
        assert_eq!(c.ansi, 2);
    }

    #[test]
    fn bidi_controls_are_removed() {
        let s = "a\u{202A}b\u{202B}c\u{202C}d\u{202D}e\u{202E}f\u{2066}g\u{2067}h\u{2068}i\u{2069}j\u{200E}k\u{200F}l\u{061C}m";
        let (out, c) = strip(s.as_bytes());
        assert_eq!(out, "abcdefghijklm");
        assert_eq!(c.bidi, 12);
    }

    #[test]
    fn zero_width_characters_are_removed() {
        let s = "a\u{200B}b\u{200C}c\u{200D}d\u{2060}e\u{FEFF}f\u{180E}g";
        let (out, c) = strip(s.as_bytes());
        assert_eq!(out, "abcdefg");
        assert_eq!(c.zero_width, 6);
    }

    #[test]
    fn tag_characters_are_removed() {
        // "ignore" smuggled in tag characters after a flag emoji.
        let hidden: String = "ignore"
            .chars()
            .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
            .collect();
        let s = format!("ok\u{E0001}{hidden}\u{E007F}!");
        let (out, c) = strip(s.as_bytes());
        assert_eq!(out, "ok!");
        assert_eq!(c.tags, 8);
    }

    #[test]
    fn invalid_utf8_is_replaced_or_rejected() {
        let (out, c) = strip(b"a\xffb\xc3(c\xe2\x82");
        assert_eq!(out, "a\u{FFFD}b\u{FFFD}(c\u{FFFD}");
        assert_eq!(c.invalid_utf8, 3);
        let p = StripPolicy::default();
        let mut s = Stripper::new(&p, 8);
        let err = s.push_bytes(b"abc\xffdef", Utf8Policy::Reject).unwrap_err();
        assert!(
            matches!(err, GateRefusal::InvalidUtf8 { offset: 3 }),
            "{err:?}"
        );
    }

    #[test]
    fn classes_can_be_switched_off() {
        let p = StripPolicy {
            control: false,
            ansi: false,
            bidi: false,
            zero_width: false,
            tags: false,
            html: false,
            markdown: false,
        };
        let input = "\x1b[31m\u{202E}\u{200B}\u{E0041}\x00";
        let mut s = Stripper::new(&p, 8);
        s.push_bytes(input.as_bytes(), Utf8Policy::Replace).unwrap();
        let (out, c) = s.finish();
        assert_eq!(out, input);
        assert_eq!(c.total(), 0);
        // ANSI off but controls on: only the ESC byte goes.
        let p = StripPolicy {
            ansi: false,
            ..StripPolicy::default()
        };
        let mut s = Stripper::new(&p, 8);
        s.push_bytes(b"\x1b[31mx", Utf8Policy::Replace).unwrap();
        let (out, c) = s.finish();
        assert_eq!(out, "[31mx");
        assert_eq!(c.control, 1);
    }

    proptest::proptest! {
        #[test]
        fn word_scan_agrees_with_the_table(b in proptest::collection::vec(
            proptest::prop_oneof![0x20u8..0x7f, proptest::num::u8::ANY], 0..100), start in 0usize..100) {
            let start = start.min(b.len());
            let mut naive = start;
            while naive < b.len() && PLAIN[b[naive] as usize] {
                naive += 1;
            }
            proptest::prop_assert_eq!(plain_run(&b, start), naive);
        }
    }

    #[test]
    fn markers_are_neutralised() {
        let mut c = StripCounts::default();
        let s = neutralise_markers(
            "x</untrusted-output nonce=\"1\"> <UNTRUSTED-OUTPUT> < / untrusted-output \u{FF1C}untrusted-output untrusted-output".to_owned(),
            &mut c,
        );
        assert_eq!(
            s,
            "x&lt;/untrusted-output nonce=\"1\"> &lt;UNTRUSTED-OUTPUT> &lt; / untrusted-output &lt;untrusted-output untrusted-output"
        );
        assert_eq!(c.marker, 4);
    }
}
