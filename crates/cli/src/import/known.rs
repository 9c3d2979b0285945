//! Well-known MCP servers and what they need: the network they reach,
//! whether they write the paths they are given, the credentials they read.
//! A server not in this table gets what its arguments say.

/// What a known server reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// No network.
    None,
    /// Exactly these `host:port` entries.
    Hosts(&'static [&'static str]),
    /// Any public destination (it fetches what the agent names).
    Any,
    /// The hosts in its arguments (a database URL, an API base).
    FromArgs,
}

/// How a known server uses the paths in its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paths {
    /// Read-only mounts.
    Read,
    /// Read-write mounts: the server changes files there.
    Write,
}

#[derive(Debug, Clone, Copy)]
pub struct Known {
    /// Package names (npm or PyPI) and module names that identify it.
    pub names: &'static [&'static str],
    /// What it does, and so what its worst input is.
    pub what: &'static str,
    pub net: Net,
    pub paths: Paths,
    /// It renders web pages or runs code from what it fetches: P3.
    pub hostile_content: bool,
    /// The scope its credentials are for, when it has any.
    pub scope: Option<&'static str>,
}

pub const KNOWN: &[Known] = &[
    Known {
        names: &["@modelcontextprotocol/server-filesystem"],
        what: "reads, writes, moves and searches files under the directories in its arguments",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &["@modelcontextprotocol/server-memory"],
        what: "a knowledge graph kept in one file (MEMORY_FILE_PATH)",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &[
            "mcp-server-fetch",
            "mcp_server_fetch",
            "@modelcontextprotocol/server-fetch",
        ],
        what: "fetches any URL the agent names and converts the page to markdown",
        net: Net::Any,
        paths: Paths::Read,
        hostile_content: true,
        scope: None,
    },
    Known {
        names: &["mcp-server-git", "mcp_server_git"],
        what: "reads and commits to the git repository given by --repository",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &["mcp-server-time", "mcp_server_time"],
        what: "time and time-zone conversion; no files, no network",
        net: Net::None,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &["@modelcontextprotocol/server-sequential-thinking"],
        what: "a scratchpad for step-by-step reasoning; no files, no network",
        net: Net::None,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &["@modelcontextprotocol/server-everything"],
        what: "the MCP reference test server (every protocol feature); no files, no network",
        net: Net::None,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &["@modelcontextprotocol/server-github"],
        what: "the GitHub REST API with a personal access token",
        net: Net::Hosts(&["api.github.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("repo"),
    },
    Known {
        names: &["@modelcontextprotocol/server-gitlab"],
        what: "the GitLab API (GITLAB_API_URL, default gitlab.com)",
        net: Net::Hosts(&["gitlab.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("api"),
    },
    Known {
        names: &["@modelcontextprotocol/server-slack"],
        what: "the Slack Web API with a bot token",
        net: Net::Hosts(&["slack.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("channels:read chat:write"),
    },
    Known {
        names: &["@modelcontextprotocol/server-brave-search"],
        what: "the Brave Search API",
        net: Net::Hosts(&["api.search.brave.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("search"),
    },
    Known {
        names: &["@modelcontextprotocol/server-google-maps"],
        what: "the Google Maps APIs",
        net: Net::Hosts(&["maps.googleapis.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("maps"),
    },
    Known {
        names: &["@modelcontextprotocol/server-postgres"],
        what: "read-only SQL on the PostgreSQL database in its URL argument",
        net: Net::FromArgs,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &["mcp-server-sqlite", "mcp_server_sqlite"],
        what: "SQL (reads and writes) on the SQLite file given by --db-path",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
    },
    Known {
        names: &[
            "@modelcontextprotocol/server-puppeteer",
            "puppeteer-mcp-server",
        ],
        what: "drives a headless Chromium on any page the agent names",
        net: Net::Any,
        paths: Paths::Read,
        hostile_content: true,
        scope: None,
    },
    Known {
        names: &[
            "@playwright/mcp",
            "@executeautomation/playwright-mcp-server",
        ],
        what: "drives a browser (Playwright) on any page the agent names",
        net: Net::Any,
        paths: Paths::Read,
        hostile_content: true,
        scope: None,
    },
    Known {
        names: &["markitdown-mcp", "markitdown_mcp"],
        what: "converts documents (PDF, Office, HTML) and URLs to markdown: a parser of untrusted bytes",
        net: Net::Any,
        paths: Paths::Read,
        hostile_content: true,
        scope: None,
    },
];

/// The known server whose package, module or script path appears in
/// `words` (the command and its arguments).
pub fn lookup<'a>(words: impl IntoIterator<Item = &'a str>) -> Option<&'static Known> {
    let words: Vec<&str> = words.into_iter().collect();
    KNOWN.iter().find(|k| {
        k.names.iter().any(|n| {
            words.iter().any(|w| {
                let bare = strip_version(w);
                bare == *n
                    || w.contains(&format!("/node_modules/{n}/"))
                    || w.contains(&format!("/site-packages/{n}/"))
                    || (n.contains('_') && w.contains(&format!("/{n}/")))
            })
        })
    })
}

/// `pkg@1.2.3` -> `pkg`, `@scope/pkg@1` -> `@scope/pkg`, `pkg==1` -> `pkg`.
pub fn strip_version(w: &str) -> &str {
    if let Some(i) = w.find("==") {
        return &w[..i];
    }
    match w.rfind('@') {
        Some(i) if i > 0 => &w[..i],
        _ => w,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_are_known_by_package_or_installed_path() {
        assert!(lookup(["npx", "-y", "@modelcontextprotocol/server-github@1.0.0"]).is_some());
        let fs = lookup([
            "/usr/bin/node",
            "/srv/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
        ])
        .unwrap();
        assert_eq!(fs.paths, Paths::Write);
        assert_eq!(
            lookup(["python3", "-m", "mcp_server_time"]).map(|k| k.names[0]),
            Some("mcp-server-time")
        );
        assert!(lookup(["/usr/bin/node", "/srv/my-server/index.js"]).is_none());
    }
}
