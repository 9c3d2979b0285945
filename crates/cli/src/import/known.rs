//! Well-known MCP servers and what they need: the network they reach,
//! whether they write the paths they are given, the credentials they read.
//! A server not in this table gets what its arguments say. `cordon import`
//! and `cordon add` both take their proposal from here (memory, start-up
//! time, environment), so a package gets the same entry whichever door it
//! came in by.

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
    /// Its memory limit, when the interpreter's default is not right.
    pub memory: Option<&'static str>,
    /// `mcp: {startup_seconds}`: how long its start may take.
    pub startup: u32,
    /// Environment it needs in a sandbox: name, value, why.
    pub env: &'static [(&'static str, &'static str, &'static str)],
}

/// The default of [`Known::startup`], and of a server not known.
pub const STARTUP: u32 = 30;

const NO_ENV: &[(&str, &str, &str)] = &[];

pub const KNOWN: &[Known] = &[
    Known {
        names: &["@modelcontextprotocol/server-filesystem"],
        what: "reads, writes, moves and searches files under the directories in its arguments",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
        memory: Some("512M"),
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-memory"],
        what: "a knowledge graph kept in one file (MEMORY_FILE_PATH)",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
        memory: Some("512M"),
        startup: STARTUP,
        env: &[(
            "MEMORY_FILE_PATH",
            "/tmp/memory.jsonl",
            "Unset, the server writes its graph next to its script, on a read-only mount: the sandbox's own /tmp instead (gone when it stops: mount a directory with `:rw` and point this into it to keep the graph)",
        )],
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
        memory: Some("512M"),
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["mcp-server-git", "mcp_server_git"],
        what: "reads and commits to the git repository given by --repository",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
        memory: Some("512M"),
        startup: STARTUP,
        env: &[(
            "GIT_CONFIG_PARAMETERS",
            "'safe.directory=*'",
            "as `git -c safe.directory=*`: the mounted repositories belong to a host uid, not the sandbox's; git's ownership check (another user's repository config on a shared machine) is the sandbox's job here",
        )],
    },
    Known {
        names: &["mcp-server-time", "mcp_server_time"],
        what: "time and time-zone conversion; no files, no network",
        net: Net::None,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
        memory: Some("256M"),
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-sequential-thinking"],
        what: "a scratchpad for step-by-step reasoning; no files, no network",
        net: Net::None,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
        memory: Some("512M"),
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-everything"],
        what: "the MCP reference test server (every protocol feature); no files, no network",
        net: Net::None,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-github"],
        what: "the GitHub REST API with a personal access token",
        net: Net::Hosts(&["api.github.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("repo"),
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-gitlab"],
        what: "the GitLab API (GITLAB_API_URL, default gitlab.com)",
        net: Net::Hosts(&["gitlab.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("api"),
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-slack"],
        what: "the Slack Web API with a bot token",
        net: Net::Hosts(&["slack.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("channels:read chat:write"),
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-brave-search"],
        what: "the Brave Search API",
        net: Net::Hosts(&["api.search.brave.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("search"),
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-google-maps"],
        what: "the Google Maps APIs",
        net: Net::Hosts(&["maps.googleapis.com:443"]),
        paths: Paths::Read,
        hostile_content: false,
        scope: Some("maps"),
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["@modelcontextprotocol/server-postgres"],
        what: "read-only SQL on the PostgreSQL database in its URL argument",
        net: Net::FromArgs,
        paths: Paths::Read,
        hostile_content: false,
        scope: None,
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["mcp-server-sqlite", "mcp_server_sqlite"],
        what: "SQL (reads and writes) on the SQLite file given by --db-path",
        net: Net::None,
        paths: Paths::Write,
        hostile_content: false,
        scope: None,
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
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
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
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
        memory: None,
        startup: STARTUP,
        env: NO_ENV,
    },
    Known {
        names: &["markitdown-mcp", "markitdown_mcp"],
        what: "converts documents (PDF, Office, HTML) and URLs to markdown: a parser of untrusted bytes",
        net: Net::Any,
        paths: Paths::Read,
        hostile_content: true,
        scope: None,
        memory: Some("1G"),
        startup: 120,
        env: NO_ENV,
    },
];

/// The known server published as `package` (npm or PyPI; `_` and `-`
/// alike, any case).
pub fn by_package(package: &str) -> Option<&'static Known> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    KNOWN
        .iter()
        .find(|k| k.names.iter().any(|n| norm(n) == norm(package)))
}

/// The memory limit proposed for a server, and why: its own when known,
/// else its interpreter's (`node`, `python`); `None`: the profile's.
pub fn memory(k: Option<&Known>, interpreter: Option<&str>) -> Option<(&'static str, String)> {
    if let Some(m) = k.and_then(|k| k.memory) {
        return Some((m, format!("what {} needs.", k.map_or("", |k| k.names[0]))));
    }
    match interpreter {
        Some("node") => Some((
            "1G",
            "node reserves more memory than the profile's default 256M.".into(),
        )),
        Some("python") => Some((
            "512M",
            "a Python server's interpreter and libraries need more than the default 256M.".into(),
        )),
        _ => None,
    }
}

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
