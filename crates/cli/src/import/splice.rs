//! `cordon import --only NAME`: a tool's block in an existing manifest's
//! text replaced (or added) by what import writes for it now, every other
//! byte kept.
//!
//! The blocks are found in the text itself, and the result is held to
//! what the loader says: the top-level `tools:` must be a block mapping
//! (one `NAME:` a line at one indentation); the names found at that
//! indentation must be exactly the manifest's tools, each where the
//! loader places it; the new text must load, and every tool but the
//! replaced ones (and everything outside `tools:`) must resolve exactly as
//! before. Anything else is refused, the text untouched.
//!
//! A tool's block is its key's line, the comment lines directly above it
//! at its indentation (where import writes its notes), and every line
//! after it up to the next tool's key or the end of `tools:`, less the
//! blank lines and shallower comments that end it (they belong to what
//! follows).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::anyhow;

use super::emit::{self, Entry};

/// What happened to one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Replaced,
    Added,
}

/// One line of the text, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Blank,
    Comment,
    /// A key at the start of its content, and what follows its `:`
    /// (comment removed, trimmed).
    Key(String, String),
    /// Anything else (a value, a sequence item, a flow continuation).
    Other,
}

#[derive(Debug)]
struct Line<'a> {
    /// The line with its line break.
    raw: &'a str,
    indent: usize,
    kind: Kind,
}

fn classify(raw: &str) -> Line<'_> {
    let content = raw.trim_end_matches(['\n', '\r']);
    let body = content.trim_start_matches(' ');
    let indent = content.len() - body.len();
    let kind = if body.trim().is_empty() {
        Kind::Blank
    } else if body.starts_with('#') {
        Kind::Comment
    } else {
        match key_of(body) {
            Some((k, rest)) => Kind::Key(k, rest),
            None => Kind::Other,
        }
    };
    Line { raw, indent, kind }
}

/// A mapping key at the start of `s` (plain, single- or double-quoted)
/// followed by `:` and a space, a comment or the end: the key and the rest
/// (without its comment, trimmed). `None` when `s` does not start that way.
fn key_of(s: &str) -> Option<(String, String)> {
    let (key, after) = if let Some(r) = s.strip_prefix('"') {
        // The closing quote: the first `"` not escaped.
        let mut escaped = false;
        let mut end = None;
        for (i, c) in r.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end?;
        // YAML's double-quoted escapes include JSON's; anything else is
        // not taken (the check against the loader would refuse it).
        let k: String = serde_json::from_str(&s[..end + 2]).ok()?;
        (k, &r[end + 1..])
    } else if let Some(r) = s.strip_prefix('\'') {
        let mut k = String::new();
        let mut it = r.char_indices().peekable();
        let mut end = None;
        while let Some((i, c)) = it.next() {
            if c == '\'' {
                if it.peek().map(|&(_, n)| n) == Some('\'') {
                    it.next();
                    k.push('\'');
                } else {
                    end = Some(i);
                    break;
                }
            } else {
                k.push(c);
            }
        }
        (k, &r[end? + 1..])
    } else {
        // A plain key: not starting with an indicator; it ends at the
        // first `: ` (or a `:` ending the line).
        if s.starts_with([
            '-', '?', ':', ',', '[', ']', '{', '}', '#', '&', '*', '!', '|', '>', '%', '@', '`',
        ]) {
            return None;
        }
        let b = s.as_bytes();
        let i = (0..b.len()).find(|&i| b[i] == b':' && b.get(i + 1).is_none_or(|c| *c == b' '))?;
        let k = s[..i].trim_end();
        if k.contains(" #") {
            return None;
        }
        (k.to_string(), &s[i..])
    };
    let after = after.trim_start_matches(' ');
    let rest = after.strip_prefix(':')?;
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    let rest = rest.trim();
    let rest = if rest.starts_with('#') { "" } else { rest };
    // A trailing comment after a value: ` #` starts it.
    let rest = match rest.find(" #") {
        Some(i) => rest[..i].trim_end(),
        None => rest,
    };
    Some((key, rest.to_string()))
}

/// The located `tools:` section.
struct Layout<'a> {
    lines: Vec<Line<'a>>,
    /// The `tools:` line.
    tools_line: usize,
    /// `tools: {}` (no tool, written as an empty flow mapping).
    empty_flow: bool,
    /// The section's lines: `tools_line + 1 .. end`.
    end: usize,
    /// The tools' indentation (when there is a tool).
    indent: Option<usize>,
    /// Each tool's name and key line, in the text's order.
    keys: Vec<(String, usize)>,
}

fn refuse_layout(path: &Path, line: usize, why: &str) -> anyhow::Error {
    anyhow!(
        "{}:{}: {why}, so the block of one tool cannot be located in it; nothing was changed (write `tools:` as a block mapping, one `NAME:` a line, or import into a new file)",
        path.display(),
        line + 1
    )
}

fn layout<'a>(path: &Path, text: &'a str) -> anyhow::Result<Layout<'a>> {
    let lines: Vec<Line<'a>> = text.split_inclusive('\n').map(classify).collect();
    let tops: Vec<usize> = (0..lines.len())
        .filter(|&i| {
            lines[i].indent == 0 && matches!(&lines[i].kind, Kind::Key(k, _) if k == "tools")
        })
        .collect();
    let tools_line = match tops[..] {
        [i] => i,
        [] => {
            return Err(anyhow!(
                "{}: no `tools:` key at the start of a line, so the block of one tool cannot be located in it; nothing was changed",
                path.display()
            ));
        }
        [_, i, ..] => return Err(refuse_layout(path, i, "a second `tools:` key")),
    };
    let empty_flow = match &lines[tools_line].kind {
        Kind::Key(_, rest) if rest.is_empty() => false,
        Kind::Key(_, rest) if rest == "{}" => true,
        _ => {
            return Err(refuse_layout(
                path,
                tools_line,
                "`tools:` is not a block mapping (its value follows it on the same line)",
            ));
        }
    };
    let end = (tools_line + 1..lines.len())
        .find(|&i| lines[i].indent == 0 && matches!(lines[i].kind, Kind::Key(..) | Kind::Other))
        .unwrap_or(lines.len());
    let content = |i: &usize| matches!(lines[*i].kind, Kind::Key(..) | Kind::Other);
    let first = (tools_line + 1..end).find(content);
    if empty_flow && let Some(i) = first {
        return Err(refuse_layout(
            path,
            i,
            "`tools: {}` is followed by more of it",
        ));
    }
    let indent = first.map(|i| lines[i].indent);
    let mut keys = Vec::new();
    if let Some(n) = indent {
        for i in (tools_line + 1..end).filter(content) {
            let l = &lines[i];
            if l.indent < n {
                return Err(refuse_layout(
                    path,
                    i,
                    "a line of `tools:` is less indented than its first tool",
                ));
            }
            if l.indent == n {
                match &l.kind {
                    Kind::Key(k, _) => keys.push((k.clone(), i)),
                    _ => {
                        return Err(refuse_layout(
                            path,
                            i,
                            "a line at the tools' indentation is not a `NAME:` key",
                        ));
                    }
                }
            }
        }
    }
    Ok(Layout {
        lines,
        tools_line,
        empty_flow,
        end,
        indent,
        keys,
    })
}

impl Layout<'_> {
    /// The lines `[start, end)` of the tool whose key is the `k`th.
    fn block(&self, k: usize) -> (usize, usize) {
        let key = self.keys[k].1;
        let n = self.indent.unwrap_or(2);
        let mut start = key;
        while start > self.tools_line + 1
            && self.lines[start - 1].kind == Kind::Comment
            && self.lines[start - 1].indent == n
        {
            start -= 1;
        }
        let mut end = self.keys.get(k + 1).map_or(self.end, |&(_, i)| i);
        while end > key + 1 {
            let l = &self.lines[end - 1];
            let tail = l.kind == Kind::Blank || (l.kind == Kind::Comment && l.indent <= n);
            if !tail {
                break;
            }
            end -= 1;
        }
        // The comments directly above the next key are its own.
        (start, end)
    }
}

/// `entry`'s text at indentation `n` (the emitter writes 2), with the
/// document's line breaks.
fn entry_text(e: &Entry, n: usize, crlf: bool) -> String {
    let text = emit::manifest_entry(e);
    let mut o = String::new();
    for line in text.lines() {
        let body = line.strip_prefix("  ").unwrap_or(line);
        o.push_str(&" ".repeat(n));
        o.push_str(body);
        o.push_str(if crlf { "\r\n" } else { "\n" });
    }
    o
}

/// The manifest at `path` (its text `text`) with each of `entries`'
/// blocks replaced, or added at the end of `tools:`; and what happened to
/// each. Refused, saying why, when the blocks cannot be located or the
/// result would not load or would change anything else.
pub fn splice(
    path: &Path,
    text: &str,
    entries: &[Entry],
) -> anyhow::Result<(String, Vec<(String, Change)>)> {
    let old = cordon_policy::load_str(path, text).map_err(|e| {
        anyhow!(
            "{} does not load, so its tools cannot be located; nothing was changed (fix it, or import into a new file):\n{e}",
            path.display()
        )
    })?;
    let l = layout(path, text)?;
    // The names at the tools' indentation are the manifest's tools, each
    // where the loader has it (its key's line, or the line after it where
    // the value starts).
    let found: BTreeSet<&str> = l.keys.iter().map(|(k, _)| k.as_str()).collect();
    let known: BTreeSet<&str> = old.policy.tools.keys().map(String::as_str).collect();
    if found.len() != l.keys.len() || found != known {
        return Err(refuse_layout(
            path,
            l.tools_line,
            &format!(
                "the keys at the tools' indentation ({}) are not the tools the manifest defines ({})",
                l.keys
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                known.iter().copied().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    for (k, (name, i)) in l.keys.iter().enumerate() {
        let Some(&(line, _)) = old.tool_at.get(name) else {
            continue;
        };
        let (_, end) = l.block(k);
        let line = usize::try_from(line).unwrap_or(0);
        // 1-based; the value may start on a later line of the block.
        if line < i + 1 || line > end.max(i + 1) {
            return Err(refuse_layout(
                path,
                *i,
                &format!("the loader places tool `{name}` at line {line}, outside its block"),
            ));
        }
    }
    let crlf = text.contains("\r\n");
    let nl = if crlf { "\r\n" } else { "\n" };
    let n = l.indent.unwrap_or(2);
    // Edits: (start line, end line, new text), none overlapping.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let mut changes = Vec::new();
    let mut added = String::new();
    let mut seen = BTreeSet::new();
    for e in entries {
        if !seen.insert(e.name.as_str()) {
            continue;
        }
        match l.keys.iter().position(|(k, _)| *k == e.name) {
            Some(k) => {
                let (s, t) = l.block(k);
                edits.push((s, t, entry_text(e, n, crlf)));
                changes.push((e.name.clone(), Change::Replaced));
            }
            None => {
                if !added.is_empty() || !l.keys.is_empty() {
                    added.push_str(nl);
                }
                added.push_str(&entry_text(e, n, crlf));
                changes.push((e.name.clone(), Change::Added));
            }
        }
    }
    if !added.is_empty() {
        if l.empty_flow {
            // `tools: {}` becomes `tools:`, keeping a comment after it.
            let raw = l.lines[l.tools_line].raw;
            let line = raw.trim_end_matches(['\n', '\r']);
            let new = line.replacen("{}", "", 1);
            let new = match new.find('#') {
                Some(i) => format!("tools: {}", &new[i..]),
                None => "tools:".to_string(),
            };
            edits.push((l.tools_line, l.tools_line + 1, format!("{new}{nl}{added}")));
        } else {
            let at = match l.keys.len() {
                0 => l.tools_line + 1,
                k => l.block(k - 1).1,
            };
            // The line before may lack its line break (the end of the file).
            let before = &l.lines[at - 1];
            if !before.raw.ends_with('\n') {
                added.insert_str(0, nl);
            }
            edits.push((at, at, added));
        }
    }
    edits.sort_by_key(|&(s, t, _)| (s, t));
    let mut out = String::new();
    let mut next = 0;
    for (s, t, new) in &edits {
        if *s < next {
            return Err(anyhow!(
                "{}: two tools' blocks overlap (a bug in cordon import); nothing was changed",
                path.display()
            ));
        }
        for line in &l.lines[next..*s] {
            out.push_str(line.raw);
        }
        out.push_str(new);
        next = *t;
    }
    for line in &l.lines[next..] {
        out.push_str(line.raw);
    }
    // The result loads, has the new tools, and everything else resolves
    // as before.
    let named = changes
        .iter()
        .map(|(n, _)| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let new = cordon_policy::load_str(path, &out).map_err(|e| {
        anyhow!(
            "{} with {named} replaced would not load, so it is left as it was:\n{e}",
            path.display(),
        )
    })?;
    let strip = |mut p: cordon_policy::policy::PolicySet| {
        for (name, _) in &changes {
            p.tools.remove(name);
        }
        p
    };
    let missing: Vec<&str> = changes
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !new.policy.tools.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        return Err(anyhow!(
            "{}: after the edit the manifest has no tool {} (a bug in cordon import); it is left as it was",
            path.display(),
            missing.join(", ")
        ));
    }
    if strip(old.policy) != strip(new.policy) {
        return Err(anyhow!(
            "{}: replacing {named} would change other tools or settings (its layout misled cordon import); it is left as it was",
            path.display(),
        ));
    }
    Ok((out, changes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, cmd: &str) -> Entry {
        Entry {
            name: name.into(),
            notes: vec![format!("From test, `{name}`.")],
            profile: ("P2".into(), "a third-party MCP server".into()),
            network: emit::Network::None("no network".into()),
            command: vec![cmd.into()],
            ..Entry::default()
        }
    }

    fn m(text: &str, entries: &[Entry]) -> anyhow::Result<String> {
        splice(Path::new("m.yaml"), text, entries).map(|(t, _)| t)
    }

    const BASE: &str = "# header\nversion: 1\ntools:\n  # From a.\n  a:\n    # why\n    profile: P2\n    network: none\n    mcp:\n      command: [\"/bin/a\"]\n\n  # From b.\n  b:\n    profile: P2\n    # hand note\n    limits: {memory: \"2G\"}\n    network: none\n    mcp:\n      command: [\"/bin/b\"]\n# trailing\n";

    #[test]
    fn keys() {
        assert_eq!(key_of("a:"), Some(("a".into(), "".into())));
        assert_eq!(key_of("a: # c"), Some(("a".into(), "".into())));
        assert_eq!(key_of("a: {x: 1} # c"), Some(("a".into(), "{x: 1}".into())));
        assert_eq!(key_of("\"a b\": x"), Some(("a b".into(), "x".into())));
        assert_eq!(key_of("'it''s':"), Some(("it's".into(), "".into())));
        assert_eq!(key_of("http://x"), None);
        assert_eq!(key_of("- a:"), None);
        assert_eq!(key_of("? a"), None);
    }

    #[test]
    fn the_tool_at_position_is_within_its_block() {
        let l = cordon_policy::load_str(Path::new("m.yaml"), BASE).unwrap();
        let (line, _) = l.tool_at["a"];
        assert!((5..=7).contains(&line), "{line}");
    }

    #[test]
    fn one_block_is_replaced_and_the_rest_kept() {
        let out = m(BASE, &[entry("a", "/bin/new")]).unwrap();
        let (head, tail) = BASE.split_at(BASE.find("\n  # From b.").unwrap());
        assert!(out.ends_with(tail), "{out}");
        assert!(out.starts_with("# header\nversion: 1\ntools:\n  # From test, `a`.\n  a:\n"));
        assert!(!out.contains("/bin/a"), "{out}");
        assert!(head.contains("/bin/a"));
        let out = m(BASE, &[entry("b", "/bin/new")]).unwrap();
        let (head, _) = BASE.split_at(BASE.find("  # From b.").unwrap());
        assert!(out.starts_with(head), "{out}");
        assert!(out.ends_with("[\"/bin/new\"]\n# trailing\n"), "{out}");
        assert!(!out.contains("hand note"), "{out}");
    }

    #[test]
    fn a_missing_tool_is_added_at_the_end_of_tools() {
        let out = m(BASE, &[entry("c", "/bin/c")]).unwrap();
        let at = BASE.find("# trailing").unwrap();
        assert!(out.starts_with(&BASE[..at]), "{out}");
        assert!(
            out[at..].starts_with("\n  # From test, `c`.\n  c:\n"),
            "{out}"
        );
        assert!(out.ends_with("[\"/bin/c\"]\n# trailing\n"), "{out}");
        // Into `tools: {}`, and at another indentation.
        let out = m(
            "version: 1\ntools: {}  # none yet\n",
            &[entry("c", "/bin/c")],
        )
        .unwrap();
        assert!(
            out.starts_with("version: 1\ntools: # none yet\n  # From test"),
            "{out}"
        );
        let four = "tools:\n    a:\n        profile: P2\n        network: none\n        mcp: {command: [\"/bin/a\"]}";
        let out = m(four, &[entry("c", "/bin/c")]).unwrap();
        assert!(out.starts_with(four), "{out}");
        assert!(
            out.contains("\n\n    # From test, `c`.\n    c:\n      # a third-party MCP server\n      profile: P2\n"),
            "{out}"
        );
        let out = m(four, &[entry("a", "/bin/new")]).unwrap();
        assert!(
            out.starts_with("tools:\n    # From test, `a`.\n    a:\n"),
            "{out}"
        );
    }

    #[test]
    fn layouts_that_hide_the_blocks_are_refused() {
        let flow =
            "version: 1\ntools: {a: {profile: P2, network: none, mcp: {command: [\"/bin/a\"]}}}\n";
        let e = m(flow, &[entry("a", "/bin/new")]).unwrap_err().to_string();
        assert!(
            e.contains("m.yaml:2: `tools:` is not a block mapping"),
            "{e}"
        );
        let e = m("{version: 1, tools: {}}\n", &[entry("a", "/bin/new")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("no `tools:` key at the start of a line"), "{e}");
        let anchored = "version: 1\ntools: &t\n  a:\n    profile: P2\n    network: none\n    mcp: {command: [\"/bin/a\"]}\n";
        let e = m(anchored, &[entry("a", "/bin/new")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a block mapping"), "{e}");
        let e = m("version: 1\ntools: [\n", &[]).unwrap_err().to_string();
        assert!(e.contains("does not load"), "{e}");
    }

    #[test]
    fn a_result_that_would_not_load_leaves_the_text() {
        // `b` takes its settings from an anchor in `a`'s block.
        let text = "tools:\n  a: &base\n    profile: P2\n    network: none\n    mcp: {command: [\"/bin/a\"]}\n  b: *base\n";
        let e = m(text, &[entry("a", "/bin/new")]).unwrap_err().to_string();
        assert!(e.contains("would not load, so it is left as it was"), "{e}");
    }
}
