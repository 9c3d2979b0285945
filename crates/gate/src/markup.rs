//! Optional markup reduction (off by default): HTML and markdown.
//!
//! Both run before the character sanitiser, so a decoded entity such as `&#x1b;` or
//! `&#x202E;` is still removed by it. Both are linear: every search for a closing
//! delimiter either reuses a cached "next occurrence" position or is bounded in length.

use crate::strip::StripCounts;

/// A forward-only finder: remembers where the next occurrence of `needle` is, so a text
/// with many openers and no closer is scanned once, not once per opener.
struct Next {
    needle: &'static [u8],
    ascii_ci: bool,
    /// Position of the next occurrence at or after the last query, or `None` when there is
    /// none left.
    cached: Option<Option<usize>>,
}

impl Next {
    fn new(needle: &'static [u8], ascii_ci: bool) -> Self {
        Next {
            needle,
            ascii_ci,
            cached: None,
        }
    }

    fn find(&mut self, hay: &[u8], from: usize) -> Option<usize> {
        match self.cached {
            Some(None) => return None,
            Some(Some(p)) if p >= from => return Some(p),
            _ => {}
        }
        let n = self.needle.len();
        let mut found = None;
        if hay.len() >= n {
            for p in from..=hay.len() - n {
                let w = &hay[p..p + n];
                let hit = if self.ascii_ci {
                    w.eq_ignore_ascii_case(self.needle)
                } else {
                    w == self.needle
                };
                if hit {
                    found = Some(p);
                    break;
                }
            }
        }
        self.cached = Some(found);
        found
    }
}

/// Named entities decoded (the common ones; others are left as written).
fn named_entity(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => '\u{A0}',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "hellip" => '…',
        "mdash" => '—',
        "ndash" => '–',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "middot" => '·',
        "bull" => '•',
        "deg" => '°',
        "euro" => '€',
        "pound" => '£',
        "yen" => '¥',
        "cent" => '¢',
        "sect" => '§',
        "para" => '¶',
        "times" => '×',
        "divide" => '÷',
        "shy" => '\u{AD}',
        "zwj" => '\u{200D}',
        "zwnj" => '\u{200C}',
        "lrm" => '\u{200E}',
        "rlm" => '\u{200F}',
        _ => return None,
    })
}

/// Decode one entity at the start of `s` (which begins with `&`): the char and the length
/// consumed. Entities are at most 32 bytes long.
fn entity(s: &str) -> Option<(char, usize)> {
    let b = s.as_bytes();
    let end = b.iter().take(34).position(|&c| c == b';')?;
    let body = &s[1..end];
    let c = if let Some(num) = body.strip_prefix('#') {
        let v = if let Some(hex) = num.strip_prefix('x').or_else(|| num.strip_prefix('X')) {
            u32::from_str_radix(hex, 16).ok()?
        } else {
            num.parse::<u32>().ok()?
        };
        // Surrogates, out of range and NUL become U+FFFD, as HTML does.
        if v == 0 {
            '\u{FFFD}'
        } else {
            char::from_u32(v).unwrap_or('\u{FFFD}')
        }
    } else {
        named_entity(body)?
    };
    Some((c, end + 1))
}

/// Remove HTML tags, comments, `<script>`/`<style>` bodies; decode entities once (a decoded
/// `&` or `<` is never looked at again).
pub(crate) fn strip_html(s: &str, counts: &mut StripCounts) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut gt = Next::new(b">", false);
    let mut comment_end = Next::new(b"-->", false);
    let mut script_end = Next::new(b"</script", true);
    let mut style_end = Next::new(b"</style", true);
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        match b[i] {
            b'<' => {
                let rest = &b[i + 1..];
                let is_tag = rest
                    .first()
                    .is_some_and(|c| c.is_ascii_alphabetic() || matches!(c, b'/' | b'!' | b'?'));
                if !is_tag {
                    i += 1;
                    continue;
                }
                let end = if rest.starts_with(b"!--") {
                    comment_end.find(b, i + 4).map(|p| p + 3)
                } else {
                    gt.find(b, i + 1).map(|p| p + 1)
                };
                let Some(mut end) = end else {
                    // No closer anywhere ahead: the rest is text.
                    i += 1;
                    continue;
                };
                let lower_starts = |tag: &[u8]| {
                    rest.len() > tag.len()
                        && rest[..tag.len()].eq_ignore_ascii_case(tag)
                        && !rest[tag.len()].is_ascii_alphanumeric()
                };
                let body_end = if lower_starts(b"script") {
                    Some(&mut script_end)
                } else if lower_starts(b"style") {
                    Some(&mut style_end)
                } else {
                    None
                };
                if let Some(finder) = body_end {
                    // Drop the body up to and including the closing tag (or to the end).
                    end = match finder.find(b, end) {
                        Some(p) => gt.find(b, p).map_or(b.len(), |q| q + 1),
                        None => b.len(),
                    };
                }
                out.push_str(&s[copied..i]);
                counts.html_tags += 1;
                i = end;
                copied = end;
            }
            b'&' => match entity(&s[i..]) {
                Some((c, len)) => {
                    out.push_str(&s[copied..i]);
                    out.push(c);
                    counts.html_entities += 1;
                    i += len;
                    copied = i;
                }
                None => i += 1,
            },
            _ => i += 1,
        }
    }
    out.push_str(&s[copied..]);
    out
}

/// Longest link text and destination looked at; longer ones are left as written.
const MAX_LINK_TEXT: usize = 1024;
const MAX_LINK_DEST: usize = 4096;

/// Find the `close` matching the `open` at `start` (nesting counted), within `limit` bytes.
fn matching(b: &[u8], start: usize, open: u8, close: u8, limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let end = b.len().min(start.saturating_add(limit));
    let mut i = start;
    while i < end {
        match b[i] {
            b'\\' => i += 1,
            b'\n' if i + 1 < end && b[i + 1] == b'\n' => return None,
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Reduce markdown to its text: `![alt](src)` -> `alt`, `[text](url)` and `[text][ref]` ->
/// `text`, emphasis markers (`*`, `_`, `~~` runs that open or close emphasis) removed.
/// Intraword `_` (snake_case), list bullets (`* item`) and a lone `*` between spaces stay.
/// Code spans and blocks are not special-cased.
pub(crate) fn strip_markdown(s: &str, counts: &mut StripCounts) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut copied = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'!' | b'[' => {
                let open = if c == b'!' { i + 1 } else { i };
                if b.get(open) != Some(&b'[') {
                    i += 1;
                    continue;
                }
                let Some(close) = matching(b, open, b'[', b']', MAX_LINK_TEXT) else {
                    i += 1;
                    continue;
                };
                let dest_end = match b.get(close + 1) {
                    Some(b'(') => matching(b, close + 1, b'(', b')', MAX_LINK_DEST),
                    Some(b'[') => matching(b, close + 1, b'[', b']', MAX_LINK_TEXT),
                    _ => None,
                };
                let Some(dest_end) = dest_end else {
                    i += 1;
                    continue;
                };
                out.push_str(&s[copied..i]);
                // The text is itself reduced (a link inside an image's alt, emphasis).
                out.push_str(&strip_markdown(&s[open + 1..close], counts));
                counts.markdown += 1;
                i = dest_end + 1;
                copied = i;
            }
            b'*' | b'_' | b'~' => {
                let run_end = b[i..]
                    .iter()
                    .position(|&x| x != c)
                    .map_or(b.len(), |p| i + p);
                let run = run_end - i;
                if c == b'~' && run < 2 {
                    i = run_end;
                    continue;
                }
                let before = s[..i].chars().next_back();
                let after = s[run_end..].chars().next();
                let ws = |ch: Option<char>| ch.is_none_or(char::is_whitespace);
                let word = |ch: Option<char>| ch.is_some_and(char::is_alphanumeric);
                let left_flanking = !ws(after);
                let right_flanking = !ws(before);
                let marker = if c == b'_' {
                    // Underscores only at word edges: snake_case stays.
                    (left_flanking && !word(before)) || (right_flanking && !word(after))
                } else {
                    left_flanking || right_flanking
                };
                if marker {
                    out.push_str(&s[copied..i]);
                    counts.markdown += 1;
                    copied = run_end;
                }
                i = run_end;
            }
            _ => i += 1,
        }
    }
    out.push_str(&s[copied..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn html(s: &str) -> (String, StripCounts) {
        let mut c = StripCounts::default();
        (strip_html(s, &mut c), c)
    }

    fn md(s: &str) -> (String, StripCounts) {
        let mut c = StripCounts::default();
        (strip_markdown(s, &mut c), c)
    }

    #[test]
    fn html_tags_are_removed_and_entities_decoded_once() {
        let (out, c) = html(
            "<p class=\"x\">Hello <b>you</b> &amp;lt;3 &#x41;&#66; &copy;</p><!-- hidden -->!",
        );
        assert_eq!(out, "Hello you &lt;3 AB ©!");
        assert_eq!(c.html_tags, 5);
        assert_eq!(c.html_entities, 4);
    }

    #[test]
    fn html_script_and_style_bodies_are_removed() {
        let (out, _) = html("a<script>alert('<b>')</script>b<STYLE>p{}</STYLE >c");
        assert_eq!(out, "abc");
    }

    #[test]
    fn html_text_that_is_not_a_tag_stays() {
        let (out, c) = html("1 < 2 and 3 > 2, a<b unclosed &unknown; & done");
        assert_eq!(out, "1 < 2 and 3 > 2, a<b unclosed &unknown; & done");
        assert_eq!(c.total(), 0);
    }

    #[test]
    fn markdown_links_and_images_become_text() {
        let (out, c) = md(
            "See [the docs](https://e.example/a_(b)) and ![a *cat*](cat.png \"t\") or [ref][1].",
        );
        assert_eq!(out, "See the docs and a cat or ref.");
        assert_eq!(c.markdown, 5);
    }

    #[test]
    fn markdown_emphasis_is_removed_but_identifiers_stay() {
        let (out, _) = md("**bold** _it_ ~~gone~~ snake_case_name 2 * 3\n* bullet");
        assert_eq!(out, "bold it gone snake_case_name 2 * 3\n* bullet");
    }

    #[test]
    fn markdown_unclosed_brackets_stay() {
        let s = "[[[[ not a link ( [x] y";
        assert_eq!(md(s).0, s);
    }
}
