//! The manifest text `cordon import` writes: one `mcp:` tool per server,
//! each proposal's reason as a YAML comment next to it. Every scalar is
//! written as a double-quoted string (a JSON string is a valid YAML
//! double-quoted scalar), so no value can change the document's shape.

use std::fmt::Write as _;

/// One proposed tool entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The tool's name in the manifest.
    pub name: String,
    /// Comment lines written above the entry (where it came from, what is
    /// known about the server, what the reviewer should look at).
    pub notes: Vec<String>,
    /// `P1`..`P3`, and why.
    pub profile: (String, String),
    /// A runtime other than the default, and why.
    pub runtime: Option<(String, String)>,
    pub network: Network,
    /// `limits:` as `(key, value)` pairs, and why.
    pub limits: Option<(Vec<(String, String)>, String)>,
    pub mounts: Vec<MountEntry>,
    /// `env:` entries: name, value, and an optional reason.
    pub env: Vec<(String, String, Option<String>)>,
    pub secrets: Vec<SecretEntry>,
    /// The server's argv as seen inside the sandbox.
    pub command: Vec<String>,
    /// A comment above `command:` (what its program was resolved from).
    pub command_note: Option<String>,
    /// `mcp: {startup_seconds}` (a known server's); `None`: the default.
    pub startup: Option<u32>,
}

/// What the tool may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// `network: none`, and why.
    None(String),
    /// `egress: [host:port, ...]`, each with its reason.
    Allow(Vec<(String, String)>),
    /// `egress: proxy` (any public destination on 80 and 443), and why.
    Proxy(String),
}

impl Default for Network {
    fn default() -> Network {
        Network::None(String::new())
    }
}

/// One bind mount: host path, path inside (the same when `None`), whether
/// it is writable, and why it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub src: String,
    pub dst: Option<String>,
    pub rw: bool,
    pub reason: String,
}

/// One `secrets:` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEntry {
    pub name: String,
    pub scope: String,
    pub ttl: u64,
    /// `Some("env")` for `deliver: env`; `None`: the default (proxy).
    pub deliver: Option<String>,
    pub reason: String,
}

/// A YAML double-quoted scalar.
pub fn q(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A mapping key: bare when it cannot be read as anything but a string.
pub fn key(s: &str) -> String {
    let plain = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "true" | "false" | "on" | "off" | "null"
        );
    if plain { s.to_string() } else { q(s) }
}

/// Comment lines (`# ...`) at `indent`, one per line of `text`.
fn comment(out: &mut String, indent: usize, text: &str) {
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            let _ = writeln!(out, "{:indent$}#", "");
        } else {
            let _ = writeln!(out, "{:indent$}# {line}", "");
        }
    }
}

/// The entry's lines under `tools:` (indented by two spaces).
pub fn manifest_entry(e: &Entry) -> String {
    let mut o = String::new();
    for n in &e.notes {
        comment(&mut o, 2, n);
    }
    let _ = writeln!(o, "  {}:", key(&e.name));
    comment(&mut o, 4, &e.profile.1);
    let _ = writeln!(o, "    profile: {}", e.profile.0);
    if let Some((rt, why)) = &e.runtime {
        comment(&mut o, 4, why);
        let _ = writeln!(o, "    runtime: {rt}");
    }
    match &e.network {
        Network::None(why) => {
            comment(&mut o, 4, why);
            let _ = writeln!(o, "    network: none");
        }
        Network::Proxy(why) => {
            comment(&mut o, 4, why);
            let _ = writeln!(o, "    egress: proxy");
        }
        Network::Allow(hosts) => {
            let _ = writeln!(o, "    egress:");
            for (hp, why) in hosts {
                comment(&mut o, 6, why);
                let _ = writeln!(o, "      - {}", q(hp));
            }
        }
    }
    if let Some((kv, why)) = &e.limits {
        comment(&mut o, 4, why);
        let body: Vec<String> = kv.iter().map(|(k, v)| format!("{k}: {}", q(v))).collect();
        let _ = writeln!(o, "    limits: {{{}}}", body.join(", "));
    }
    if !e.mounts.is_empty() {
        let _ = writeln!(o, "    mounts:");
        for m in &e.mounts {
            comment(&mut o, 6, &m.reason);
            let mut s = m.src.clone();
            match (&m.dst, m.rw) {
                (None, false) => {}
                (None, true) => {
                    s.push(':');
                    s.push_str(&m.src);
                    s.push_str(":rw");
                }
                (Some(d), rw) => {
                    s.push(':');
                    s.push_str(d);
                    s.push_str(if rw { ":rw" } else { ":ro" });
                }
            }
            let _ = writeln!(o, "      - {}", q(&s));
        }
    }
    if !e.env.is_empty() {
        let _ = writeln!(o, "    env:");
        for (k, v, why) in &e.env {
            if let Some(why) = why {
                comment(&mut o, 6, why);
            }
            let _ = writeln!(o, "      {}: {}", q(k), q(v));
        }
    }
    if !e.secrets.is_empty() {
        let _ = writeln!(o, "    secrets:");
        for s in &e.secrets {
            comment(&mut o, 6, &s.reason);
            let _ = writeln!(o, "      - name: {}", q(&s.name));
            let _ = writeln!(o, "        scope: {}", q(&s.scope));
            let _ = writeln!(o, "        ttl: {}", s.ttl);
            if let Some(d) = &s.deliver {
                let _ = writeln!(o, "        deliver: {d}");
            }
        }
    }
    let argv: Vec<String> = e.command.iter().map(|a| q(a)).collect();
    let _ = writeln!(o, "    mcp:");
    if let Some(t) = e.startup {
        let _ = writeln!(o, "      startup_seconds: {t}");
    }
    if let Some(n) = &e.command_note {
        comment(&mut o, 6, n);
    }
    let _ = writeln!(o, "      command: [{}]", argv.join(", "));
    o
}

/// A whole manifest: the header comment lines, then every entry.
pub fn manifest(header: &[String], entries: &[Entry]) -> String {
    let mut o = String::new();
    for h in header {
        comment(&mut o, 0, h);
    }
    o.push_str("version: 1\ntools:\n");
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            o.push('\n');
        }
        o.push_str(&manifest_entry(e));
    }
    if entries.is_empty() {
        // `tools: {}`: a manifest with no tool is still valid YAML.
        o.truncate(o.len() - "tools:\n".len());
        o.push_str("tools: {}\n");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            name: "files".into(),
            notes: vec!["From a.json, mcpServers.files.".into()],
            profile: ("P2".into(), "a third-party MCP server".into()),
            runtime: None,
            network: Network::Allow(vec![("api.example.com:443".into(), "from args".into())]),
            limits: Some((vec![("memory".into(), "1G".into())], "node".into())),
            mounts: vec![
                MountEntry {
                    src: "/srv/a".into(),
                    dst: None,
                    rw: false,
                    reason: "ro".into(),
                },
                MountEntry {
                    src: "/srv/b".into(),
                    dst: None,
                    rw: true,
                    reason: "rw".into(),
                },
            ],
            env: vec![("MODE".into(), "a \"b\"\nc: d".into(), None)],
            secrets: vec![SecretEntry {
                name: "API_TOKEN".into(),
                scope: "files".into(),
                ttl: 3600,
                deliver: None,
                reason: "its name".into(),
            }],
            command: vec!["/usr/bin/node".into(), "# not a comment".into()],
            command_note: None,
            startup: Some(45),
        }
    }

    #[test]
    fn the_written_manifest_parses_and_keeps_every_value() {
        let text = manifest(&["header".into()], &[entry()]);
        let loaded = cordon_policy::load_str(std::path::Path::new("m.yaml"), &text)
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        let t = &loaded.policy.tools["files"];
        assert_eq!(t.env["MODE"], "a \"b\"\nc: d");
        assert_eq!(t.secrets[0].name, "API_TOKEN");
        assert!(t.mounts.iter().any(|m| m.src == "/srv/b" && m.writable));
        assert!(t.mounts.iter().any(|m| m.src == "/srv/a" && !m.writable));
        assert!(text.contains("      startup_seconds: 45\n"), "{text}");
        match &t.exec {
            cordon_policy::policy::Exec::Mcp { command, .. } => assert_eq!(
                command.as_deref(),
                Some(&["/usr/bin/node".to_string(), "# not a comment".to_string()][..])
            ),
            other => panic!("{other:?}"),
        }
        assert!(text.starts_with("# header\n"), "{text}");
    }

    #[test]
    fn an_empty_import_is_a_valid_manifest() {
        let text = manifest(&[], &[]);
        cordon_policy::load_str(std::path::Path::new("m.yaml"), &text).unwrap();
    }
}
