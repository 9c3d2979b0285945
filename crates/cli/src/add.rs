//! `cordon add npm:PACKAGE[@VERSION] | pypi:PACKAGE[==VERSION]`: install an
//! MCP server into cordon's store (crates/store) and write the manifest's
//! `mcp:` tool for it: the command as the sandbox sees it, the store's
//! install mounted read-only, its environment, a profile and `network:
//! none`, with the reasons as comments. A small table of well-known
//! servers supplies their names, needs and arguments.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use cordon_store::{Ecosystem, Installed, PackageRef, Source, Store};

#[derive(clap::Args)]
pub struct AddArgs {
    /// `npm:NAME[@VERSION]` or `pypi:NAME[==VERSION]` (no version: the
    /// newest, recorded in the entry).
    package: String,
    /// The tool's name in the manifest (default: from the package, e.g.
    /// `memory` for @modelcontextprotocol/server-memory).
    #[arg(long)]
    name: Option<String>,
    /// The manifest to add the tool to (created if missing). Default:
    /// $CORDON_MANIFEST, else ./cordon.yaml.
    #[arg(
        short = 'm',
        long = "manifest",
        env = "CORDON_MANIFEST",
        default_value = "cordon.yaml"
    )]
    manifest: PathBuf,
    /// Print the tool entry instead of writing it to the manifest.
    #[arg(long)]
    print: bool,
    /// Replace a tool of the same name already in the manifest.
    #[arg(long)]
    force: bool,
    /// The package store. Default: `store/` beside the image store:
    /// $CORDON_STORE/store, else /var/lib/cordon/store as root, else
    /// ~/.local/share/cordon/store.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// Install without the network: npm from its cache (or --from's),
    /// PyPI from --from's wheels.
    #[arg(long)]
    offline: bool,
    /// Install offline from DIR: an npm cache directory (as `npm install
    /// --cache DIR PKG` fills) for npm packages, a directory of wheels (as
    /// `pip download --only-binary :all: -d DIR PKG` makes) for PyPI.
    /// Implies --offline.
    #[arg(long, value_name = "DIR")]
    from: Option<PathBuf>,
    /// A host path the server needs, as the manifest writes it:
    /// `SRC[:DST][:ro|rw]` (read-only unless `:rw`). Repeatable.
    #[arg(long = "mount", value_name = "SRC[:DST][:MODE]")]
    mounts: Vec<String>,
    /// Build an OCI image of the server instead (not available: see the
    /// message).
    #[arg(long)]
    image: bool,
    /// Arguments for the server, after `--` (replace the well-known
    /// server's defaults).
    #[arg(last = true, value_name = "ARGS")]
    args: Vec<String>,
}

/// What is known of a well-known server.
struct Known {
    ecosystem: Ecosystem,
    package: &'static str,
    tool: &'static str,
    description: &'static str,
    /// The profile, and why.
    profile: (&'static str, &'static str),
    /// Why `network: none`, or what it needs instead.
    network: &'static str,
    args: &'static [&'static str],
    /// What the entry's comment says to add (mounts, arguments).
    note: Option<&'static str>,
}

const P2_SERVER: &str =
    "a long-running MCP server, kept for the agent's session with cgroup limits";

const KNOWN: &[Known] = &[
    Known {
        ecosystem: Ecosystem::Npm,
        package: "@modelcontextprotocol/server-memory",
        tool: "memory",
        description: "A knowledge graph the agent keeps: entities, relations, observations.",
        profile: ("P2", P2_SERVER),
        network: "it reads and writes only its own memory file",
        args: &[],
        note: None,
    },
    Known {
        ecosystem: Ecosystem::Npm,
        package: "@modelcontextprotocol/server-sequential-thinking",
        tool: "sequential_thinking",
        description: "Structured step-by-step thinking, one thought per call.",
        profile: ("P2", P2_SERVER),
        network: "it only records the thoughts it is given",
        args: &[],
        note: None,
    },
    Known {
        ecosystem: Ecosystem::Npm,
        package: "@modelcontextprotocol/server-filesystem",
        tool: "filesystem",
        description: "Files in the directories it is given.",
        profile: ("P2", P2_SERVER),
        network: "it works on the mounted directories only",
        args: &["/data"],
        note: Some(
            "mount the directories it serves (`--mount HOST_DIR:/data`, `:rw` to let it write)",
        ),
    },
    Known {
        ecosystem: Ecosystem::Pypi,
        package: "mcp-server-time",
        tool: "time",
        description: "The current time, and conversions between time zones.",
        profile: ("P2", P2_SERVER),
        network: "it reads only the host's time zone database",
        // The sandbox's /etc names no local zone.
        args: &["--local-timezone", "UTC"],
        note: None,
    },
    Known {
        ecosystem: Ecosystem::Pypi,
        package: "mcp-server-git",
        tool: "git",
        description: "Read and change the git repositories mounted for it.",
        profile: ("P2", P2_SERVER),
        network: "it works on local repositories only (no fetch or push)",
        args: &[],
        note: Some(
            "mount the repositories (`--mount HOST_REPO:/repo:rw`; read-only for status, log and diff)",
        ),
    },
    Known {
        ecosystem: Ecosystem::Pypi,
        package: "markitdown-mcp",
        tool: "markitdown",
        description: "Convert a document (PDF, Office, HTML, ...) to Markdown.",
        profile: (
            "P2",
            "it parses untrusted documents in one long-running MCP server (a P1 parser jail runs one command per call)",
        ),
        network: "file: URIs of the mounted files only; http(s) URIs need `egress:` to their hosts",
        args: &[],
        note: Some(
            "mount the files to convert (`--mount HOST_DIR:/data`), named as file:///data/NAME",
        ),
    },
    Known {
        ecosystem: Ecosystem::Pypi,
        package: "mcp-server-fetch",
        tool: "fetch",
        description: "Fetch a web page as Markdown.",
        profile: ("P2", P2_SERVER),
        network: "it needs the network to the sites it fetches: replace `network: none` with `egress: [HOST:443, ...]`",
        args: &[],
        note: None,
    },
];

fn known(pkg: &PackageRef) -> Option<&'static Known> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    KNOWN
        .iter()
        .find(|k| k.ecosystem == pkg.ecosystem && norm(k.package) == norm(&pkg.name))
}

/// A tool name from a package name: the unscoped name without
/// `mcp-server-`, `server-` or `-mcp`, other characters as `_`.
fn default_name(pkg: &PackageRef) -> String {
    let base = pkg.name.rsplit('/').next().unwrap_or(&pkg.name);
    let lower = base.to_ascii_lowercase().replace('_', "-");
    let mut s = lower.as_str();
    for p in ["mcp-server-", "server-", "mcp-"] {
        if let Some(r) = s.strip_prefix(p).filter(|r| !r.is_empty()) {
            s = r;
            break;
        }
    }
    for suf in ["-mcp-server", "-mcp", "-server"] {
        if let Some(r) = s.strip_suffix(suf).filter(|r| !r.is_empty()) {
            s = r;
            break;
        }
    }
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(48)
        .collect()
}

fn q(s: &str) -> String {
    // A JSON string is a YAML double-quoted scalar.
    serde_json::Value::String(s.to_string()).to_string()
}

/// The tool entry, its keys indented by `unit` (the manifest's own).
fn entry(
    name: &str,
    inst: &Installed,
    k: Option<&Known>,
    args: &[String],
    extra_mounts: &[String],
    unit: &str,
) -> String {
    let (i1, i2, i3) = (unit.to_string(), unit.repeat(2), unit.repeat(3));
    let mut o = String::new();
    let line = |o: &mut String, ind: &str, s: &str| {
        o.push_str(ind);
        o.push_str(s);
        o.push('\n');
    };
    let digest = &inst.lock_digest[..16.min(inst.lock_digest.len())];
    let pinned = match inst.package.ecosystem {
        Ecosystem::Npm => format!("npm:{}@{}", inst.package.name, inst.version),
        Ecosystem::Pypi => format!("pypi:{}=={}", inst.package.name, inst.version),
    };
    line(
        &mut o,
        &i1,
        &format!("# {pinned}, added by `cordon add` (lock {digest}): installed in"),
    );
    line(
        &mut o,
        &i1,
        &format!("# {}, mounted read-only;", inst.root.display()),
    );
    line(
        &mut o,
        &i1,
        "# the sandbox runs it with no download and no host path but the mounts below.",
    );
    let (profile, why) = k.map_or(("P2", P2_SERVER), |k| k.profile);
    line(&mut o, &i1, &format!("# {profile}: {why}."));
    let network_why = k.map_or(
        "not known to need any: add `egress: [HOST:PORT]` for what it must reach",
        |k| k.network,
    );
    line(&mut o, &i1, &format!("# network none: {network_why}."));
    if let Some(n) = k.and_then(|k| k.note) {
        line(&mut o, &i1, &format!("# Add: {n}."));
    }
    line(&mut o, &i1, &format!("{name}:"));
    line(&mut o, &i2, &format!("profile: {profile}"));
    let desc = k.map_or_else(
        || format!("{pinned}, an MCP server."),
        |k| k.description.to_string(),
    );
    line(&mut o, &i2, &format!("description: {}", q(&desc)));
    line(&mut o, &i2, "network: none");
    line(&mut o, &i2, "lifetime: session");
    // The proposal `cordon import` makes for the same package.
    let shared = crate::import::known::by_package(&inst.package.name);
    let interpreter = match inst.package.ecosystem {
        Ecosystem::Npm => "node",
        Ecosystem::Pypi => "python",
    };
    let memory = crate::import::known::memory(shared, Some(interpreter)).map_or("512M", |(m, _)| m);
    line(
        &mut o,
        &i2,
        &format!("limits: {{wall_seconds: 60, memory: {memory}, tasks: 64}}"),
    );
    let mut mounts: Vec<String> = inst
        .mounts
        .iter()
        .map(|m| {
            format!(
                "{}:{}:{}",
                m.src.display(),
                m.dst.display(),
                if m.rw { "rw" } else { "ro" }
            )
        })
        .collect();
    mounts.extend(extra_mounts.iter().cloned());
    let list: Vec<String> = mounts.iter().map(|m| q(m)).collect();
    line(&mut o, &i2, &format!("mounts: [{}]", list.join(", ")));
    let mut env: Vec<(String, String, Option<&str>)> = inst
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone(), None))
        .collect();
    for (n, v, why) in shared.map_or(&[][..], |k| k.env) {
        env.push(((*n).to_string(), (*v).to_string(), Some(*why)));
    }
    if !env.is_empty() {
        line(&mut o, &i2, "env:");
        for (n, v, why) in env {
            if let Some(why) = why {
                line(&mut o, &i3, &format!("# {why}"));
            }
            line(&mut o, &i3, &format!("{n}: {}", q(&v)));
        }
    }
    line(&mut o, &i2, "mcp:");
    let startup = shared.map_or(crate::import::known::STARTUP, |k| k.startup);
    line(&mut o, &i3, &format!("startup_seconds: {startup}"));
    let mut argv: Vec<String> = inst.command.clone();
    if args.is_empty() {
        argv.extend(
            k.map_or(&[][..], |k| k.args)
                .iter()
                .map(|s| (*s).to_string()),
        );
    } else {
        argv.extend(args.iter().cloned());
    }
    let list: Vec<String> = argv.iter().map(|a| q(a)).collect();
    line(&mut o, &i3, &format!("command: [{}]", list.join(", ")));
    o
}

pub fn run(a: &AddArgs) -> anyhow::Result<ExitCode> {
    let pkg = PackageRef::parse(&a.package)?;
    if a.image {
        bail!(
            "{pkg}: --image is not available: cordon's image store (crates/image) pulls, loads and unpacks OCI images but cannot build one. \
Build an image of the server with your image builder, load it with `cordon image load` (or push it and `cordon image pull` it), \
and write an `image:` tool for it (docs/add.md)"
        );
    }
    let name = match &a.name {
        Some(n) => n.clone(),
        None => known(&pkg).map_or_else(|| default_name(&pkg), |k| k.tool.to_string()),
    };
    if let Some(why) = cordon_policy::policy::invalid_name_reason(&name) {
        bail!("tool name `{name}`: {why}; choose one with --name");
    }
    // Refuse a name already taken before installing anything.
    let existing = if a.print {
        None
    } else {
        read_manifest(&a.manifest)?
    };
    if let Some(text) = &existing
        && !a.force
        && tool_names(&a.manifest, text)?.contains(&name)
    {
        bail!(
            "{}: a tool `{name}` is already there: pass --force to replace it, or --name to add this one under another name",
            a.manifest.display()
        );
    }
    let root = match &a.store {
        Some(d) => d.clone(),
        None => Store::default_root()?,
    };
    let source = if a.offline || a.from.is_some() {
        Source::Offline {
            from: a.from.clone(),
        }
    } else {
        Source::Network
    };
    let store = Store::at(root).with_source(source);
    let inst = store.install(&pkg)?;
    eprintln!(
        "{} {pkg} version {} at {}",
        if inst.reused { "reusing" } else { "installed" },
        inst.version,
        inst.root.display()
    );
    let k = known(&pkg);
    if a.print {
        print!("{}", entry(&name, &inst, k, &a.args, &a.mounts, "  "));
        return Ok(ExitCode::SUCCESS);
    }
    let text = existing.unwrap_or_else(|| "version: 1\ntools:\n".to_string());
    let new = insert(&text, &name, |unit| {
        entry(&name, &inst, k, &a.args, &a.mounts, unit)
    })
    .with_context(|| format!("add `{name}` to {}", a.manifest.display()))?;
    // The result must load, with the tool in it.
    match cordon_policy::load_str(&a.manifest, &new) {
        Ok(l) if l.policy.tools.contains_key(&name) => {}
        Ok(_) => bail!(
            "{}: the written entry did not load as tool `{name}`",
            a.manifest.display()
        ),
        Err(e) => bail!("the entry for `{name}` does not load:\n{e}"),
    }
    write_atomically(&a.manifest, &new)?;
    eprintln!(
        "added tool `{name}` to {}; `cordon check -m {}` reviews it, `cordon serve -m {}` serves it",
        a.manifest.display(),
        a.manifest.display(),
        a.manifest.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn read_manifest(p: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(p) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("read {}", p.display())),
    }
}

fn tool_names(p: &Path, text: &str) -> anyhow::Result<Vec<String>> {
    match cordon_policy::load_str(p, text) {
        Ok(l) => Ok(l.policy.tools.keys().cloned().collect()),
        Err(e) => bail!("{e}\n{}: invalid; fix it before adding to it", p.display()),
    }
}

fn indent_of(l: &str) -> usize {
    l.len() - l.trim_start_matches(' ').len()
}

fn significant(l: &str) -> bool {
    let t = l.trim();
    !t.is_empty() && !t.starts_with('#')
}

/// `text` with the entry for `name` added at the end of its `tools:`
/// mapping (in place of a tool of that name, whose block and the comment
/// right above it are removed). The entry is made by `make` for the
/// indentation unit the mapping uses.
fn insert(text: &str, name: &str, make: impl Fn(&str) -> String) -> anyhow::Result<String> {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let tools_at = lines
        .iter()
        .position(|l| {
            let t = l.split(" #").next().unwrap_or("").trim_end();
            t == "tools:" || t == "tools: {}"
        })
        .context("it has no top-level `tools:` mapping written in block style")?;
    if lines[tools_at].trim_end().starts_with("tools: {}") {
        lines[tools_at] = "tools:".to_string();
    }
    // The mapping ends before the next top-level key.
    let mut end = lines.len();
    for (i, l) in lines.iter().enumerate().skip(tools_at + 1) {
        if significant(l) && indent_of(l) == 0 {
            end = i;
            break;
        }
    }
    let unit = lines[tools_at + 1..end]
        .iter()
        .find(|l| significant(l))
        .map_or(2, |l| indent_of(l));
    if unit == 0 {
        bail!("its `tools:` mapping is not indented with spaces");
    }
    let unit = " ".repeat(unit);
    let key = format!("{unit}{name}:");
    if let Some(start) = lines[tools_at + 1..end]
        .iter()
        .position(|l| l.trim_end() == key || l.starts_with(&format!("{key} ")))
        .map(|p| p + tools_at + 1)
    {
        let mut stop = end;
        for (i, l) in lines.iter().enumerate().take(end).skip(start + 1) {
            if !l.trim().is_empty() && indent_of(l) <= unit.len() {
                stop = i;
                break;
            }
        }
        let mut first = start;
        while first > tools_at + 1
            && lines[first - 1].trim_start().starts_with('#')
            && indent_of(&lines[first - 1]) == unit.len()
        {
            first -= 1;
        }
        lines.drain(first..stop);
        end -= stop - first;
    }
    // Before the next top-level key, after the mapping's last line.
    let mut at = end;
    while at > tools_at + 1 && lines[at - 1].trim().is_empty() {
        at -= 1;
    }
    let mut block: Vec<String> = Vec::new();
    if at > tools_at + 1 {
        block.push(String::new());
    }
    block.extend(make(&unit).lines().map(str::to_string));
    if lines.get(at).is_some_and(|l| !l.trim().is_empty()) {
        block.push(String::new());
    }
    lines.splice(at..at, block);
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}

fn write_atomically(p: &Path, text: &str) -> anyhow::Result<()> {
    let dir = p
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file = p.file_name().context("the manifest path names no file")?;
    let tmp = dir.join(format!(
        ".{}.cordon-add-{}",
        file.to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
    if let Ok(m) = std::fs::metadata(p) {
        let _ = std::fs::set_permissions(&tmp, m.permissions());
    }
    std::fs::rename(&tmp, p).with_context(|| {
        let _ = std::fs::remove_file(&tmp);
        format!("replace {}", p.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make(unit: &str) -> String {
        format!("{unit}# new\n{unit}x:\n{unit}{unit}profile: P2\n")
    }

    #[test]
    fn entries_go_at_the_end_of_tools_in_its_indentation() {
        let t = "version: 1\ntools:\n    a:\n        profile: P1\n\nother: 1\n";
        let out = insert(t, "x", make).unwrap();
        assert_eq!(
            out,
            "version: 1\ntools:\n    a:\n        profile: P1\n\n    # new\n    x:\n        profile: P2\n\nother: 1\n"
        );
        let out = insert("version: 1\ntools: {}\n", "x", make).unwrap();
        assert_eq!(out, "version: 1\ntools:\n  # new\n  x:\n    profile: P2\n");
    }

    #[test]
    fn a_replaced_tool_loses_its_block_and_comment() {
        let t = "version: 1\ntools:\n  # old\n  x:\n    profile: P1\n    mcp:\n      command: [a]\n  # b's\n  b:\n    profile: P1\n";
        let out = insert(t, "x", make).unwrap();
        assert_eq!(
            out,
            "version: 1\ntools:\n  # b's\n  b:\n    profile: P1\n\n  # new\n  x:\n    profile: P2\n"
        );
    }

    #[test]
    fn default_names() {
        let n = |s: &str| default_name(&PackageRef::parse(s).unwrap());
        assert_eq!(
            n("npm:@modelcontextprotocol/server-everything"),
            "everything"
        );
        assert_eq!(n("pypi:mcp-server-sqlite"), "sqlite");
        assert_eq!(n("pypi:markitdown-mcp"), "markitdown");
        assert_eq!(n("npm:some.tool"), "some_tool");
    }
}
