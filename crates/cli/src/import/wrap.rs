//! `cordon wrap`: rewrite a client configuration so that the client starts
//! `cordon serve -m MANIFEST` (stdio) in place of the servers imported into
//! that manifest, keeping the original byte for byte next to it;
//! `cordon unwrap` puts the original back. The edit keeps the file's
//! comments and layout (a JSON-with-comments syntax tree, or Codex's TOML
//! document, is edited, not re-serialised).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use jsonc_parser::cst::{CstInputValue, CstRootNode};
use sha2::Digest as _;

use super::formats::{self, Format};
use super::map::tool_name;
use crate::exit;

/// Where `cordon serve` reads its provider file when given none.
const DEFAULT_PROVIDERS: &str = "/etc/cordon/providers.yaml";

/// The name of the entry wrap adds.
pub const ENTRY: &str = "cordon";

#[derive(clap::Args, Debug)]
pub struct WrapArgs {
    /// The client's configuration (Claude Desktop, Claude Code, Cursor,
    /// VS Code, Windsurf, Zed, Gemini CLI; Codex's TOML).
    pub config: PathBuf,
    /// The manifest the servers were imported into; the client starts
    /// `cordon serve -m` with it.
    #[arg(short = 'm', long = "manifest", default_value = "cordon.yaml")]
    pub manifest: PathBuf,
    /// The configuration's format (default: detected).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Print the change; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The cordon the client starts (default: this one).
    #[arg(long, value_name = "PATH")]
    pub cordon: Option<PathBuf>,
    /// The credential broker's provider file the wrapped `cordon serve`
    /// reads (`serve --providers`). Required when a server of the manifest
    /// declares secrets and /etc/cordon/providers.yaml does not exist: the
    /// client would otherwise lose those servers' tools.
    #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
    pub providers: Option<PathBuf>,
}

/// What the wrapped client starts: `cordon serve -m MANIFEST [--providers FILE]`.
pub struct Serve {
    pub cordon: PathBuf,
    pub manifest: PathBuf,
    pub providers: Option<PathBuf>,
}

impl Serve {
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            "serve".to_string(),
            "-m".into(),
            self.manifest.display().to_string(),
        ];
        if let Some(p) = &self.providers {
            a.push("--providers".into());
            a.push(p.display().to_string());
        }
        a
    }
}

#[derive(clap::Args, Debug)]
pub struct UnwrapArgs {
    /// The client's configuration, as `cordon wrap` left it.
    pub config: PathBuf,
    /// Restore the backup even if the configuration changed since it was wrapped.
    #[arg(long)]
    pub force: bool,
}

/// The original configuration, byte for byte.
pub fn backup_path(config: &Path) -> PathBuf {
    sibling(config, ".cordon-backup")
}

/// The sha256 of what wrap wrote (to tell a later edit).
fn digest_path(config: &Path) -> PathBuf {
    sibling(config, ".cordon-wrapped.sha256")
}

fn sibling(config: &Path, suffix: &str) -> PathBuf {
    let mut name = config.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    config.with_file_name(name)
}

fn sha256(b: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(b))
}

fn abs(p: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

/// The configuration text with the manifest's servers replaced by one
/// `cordon` entry, and the servers replaced.
pub fn wrapped(
    config: &Path,
    text: &str,
    format: Format,
    tools: &[String],
    serve: &Serve,
) -> anyhow::Result<(String, Vec<String>)> {
    let (cordon, manifest) = (&serve.cordon, &serve.manifest);
    if format == Format::Codex {
        return wrapped_toml(config, text, tools, serve);
    }
    let Some(key) = format.servers_key() else {
        bail!(
            "{}: wrap edits JSON and TOML configurations; {} keeps its servers in YAML or a list: point it at `{} serve -m {}` by hand",
            config.display(),
            format.name(),
            cordon.display(),
            manifest.display()
        );
    };
    let opts = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_loose_object_property_names: false,
        allow_trailing_commas: true,
    };
    let root = CstRootNode::parse(text, &opts)
        .map_err(|e| anyhow!("{}: not valid JSON: {e}", config.display()))?;
    let obj = root
        .object_value()
        .ok_or_else(|| anyhow!("{}: not a JSON object", config.display()))?;
    let (servers, at) = match obj.object_value(key) {
        Some(s) => (s, key.to_string()),
        None => match obj
            .object_value("mcp")
            .and_then(|m| m.object_value("servers"))
        {
            Some(s) if format == Format::Vscode => (s, "mcp.servers".to_string()),
            _ => bail!("{}: no `{key}` object", config.display()),
        },
    };
    let mut replaced = Vec::new();
    for prop in servers.properties() {
        let Some(name) = prop.name().and_then(|n| n.decoded_value().ok()) else {
            continue;
        };
        if name == ENTRY {
            bail!(
                "{}: `{at}` already has a `{ENTRY}` entry: already wrapped? (`cordon unwrap` restores the original)",
                config.display()
            );
        }
        if tools.contains(&tool_name(&name)) {
            replaced.push(name);
            prop.remove();
        }
    }
    if replaced.is_empty() {
        bail!(
            "{}: none of the servers in `{at}` is a tool of {}: import them first (`cordon import`)",
            config.display(),
            manifest.display()
        );
    }
    let s = |x: &str| CstInputValue::String(x.to_string());
    let mut entry = Vec::new();
    if format == Format::Vscode {
        entry.push(("type".to_string(), s("stdio")));
    }
    if format == Format::Zed {
        entry.push(("source".to_string(), s("custom")));
    }
    entry.push(("command".to_string(), s(&cordon.display().to_string())));
    entry.push((
        "args".to_string(),
        CstInputValue::Array(serve.args().iter().map(|a| s(a)).collect()),
    ));
    servers.append(ENTRY, CstInputValue::Object(entry));
    Ok((root.to_string(), replaced))
}

/// Codex's `config.toml`: the `[mcp_servers.NAME]` tables of the
/// manifest's servers out, `[mcp_servers.cordon]` in.
fn wrapped_toml(
    config: &Path,
    text: &str,
    tools: &[String],
    serve: &Serve,
) -> anyhow::Result<(String, Vec<String>)> {
    let (cordon, manifest) = (&serve.cordon, &serve.manifest);
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e| anyhow!("{}: not valid TOML: {e}", config.display()))?;
    let servers = doc
        .get_mut("mcp_servers")
        .and_then(toml_edit::Item::as_table_like_mut)
        .ok_or_else(|| anyhow!("{}: no `[mcp_servers]` table", config.display()))?;
    let names: Vec<String> = servers.iter().map(|(k, _)| k.to_string()).collect();
    if names.iter().any(|n| n == ENTRY) {
        bail!(
            "{}: `mcp_servers` already has a `{ENTRY}` entry: already wrapped? (`cordon unwrap` restores the original)",
            config.display()
        );
    }
    let mut replaced = Vec::new();
    for n in names {
        if tools.contains(&tool_name(&n)) {
            servers.remove(&n);
            replaced.push(n);
        }
    }
    if replaced.is_empty() {
        bail!(
            "{}: none of the servers in `mcp_servers` is a tool of {}: import them first (`cordon import`)",
            config.display(),
            manifest.display()
        );
    }
    let mut t = toml_edit::Table::new();
    t.insert("command", toml_edit::value(cordon.display().to_string()));
    let args: toml_edit::Array = serve.args().into_iter().collect();
    t.insert("args", toml_edit::value(args));
    servers.insert(ENTRY, toml_edit::Item::Table(t));
    Ok((doc.to_string(), replaced))
}

fn diff(old: &str, new: &str, path: &Path) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .header(
            &format!("{} (before)", path.display()),
            &format!("{} (wrapped)", path.display()),
        )
        .to_string()
}

pub fn wrap(a: &WrapArgs) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&a.config)
        .with_context(|| format!("reading {}", a.config.display()))?;
    let format = match a.format {
        Some(f) => f,
        None => formats::detect(&a.config, &text)?,
    };
    let loaded = cordon_policy::load(&a.manifest).map_err(|e| anyhow!("{e}"))?;
    let servers: Vec<&cordon_policy::policy::ToolPolicy> = loaded
        .policy
        .tools
        .values()
        .filter(|t| matches!(t.exec, cordon_policy::policy::Exec::Mcp { .. }))
        .collect();
    let tools: Vec<String> = servers.iter().map(|t| t.name.clone()).collect();
    let cordon = match &a.cordon {
        Some(c) => abs(c)?,
        None => std::env::current_exe().context("locating cordon itself")?,
    };
    let providers = match &a.providers {
        Some(p) => {
            std::fs::metadata(p).with_context(|| format!("--providers {}", p.display()))?;
            Some(abs(p)?)
        }
        None => None,
    };
    let with_secrets: Vec<&str> = servers
        .iter()
        .filter(|t| !t.secrets.is_empty())
        .map(|t| t.name.as_str())
        .collect();
    if providers.is_none() && !with_secrets.is_empty() && !Path::new(DEFAULT_PROVIDERS).exists() {
        bail!(
            "{}: {} declare(s) secrets, and no provider file is given (--providers) or at {DEFAULT_PROVIDERS}: the wrapped client would lose their tools. Write a provider file (docs/secrets.md) and pass `--providers FILE`, or remove those tools from the manifest",
            a.manifest.display(),
            with_secrets.join(", ")
        );
    }
    let serve = Serve {
        cordon,
        manifest: abs(&a.manifest)?,
        providers,
    };
    let manifest = &serve.manifest;
    let (new, replaced) = wrapped(&a.config, &text, format, &tools, &serve)?;
    print!("{}", diff(&text, &new, &a.config));
    if a.dry_run {
        eprintln!(
            "cordon wrap: --dry-run: {} unchanged ({} server(s) would be served by cordon: {})",
            a.config.display(),
            replaced.len(),
            replaced.join(", ")
        );
        return Ok(ExitCode::from(exit::OK));
    }
    let backup = backup_path(&a.config);
    // The original first: if anything below fails, it is still there.
    // Mode 0600 whatever the original's: a client configuration often
    // holds tokens in `env`, and the backup outlives the wrap.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&backup)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
        .with_context(|| {
            format!(
                "writing the backup {} (if it exists, {} is already wrapped: `cordon unwrap` first)",
                backup.display(),
                a.config.display()
            )
        })?;
    std::fs::write(digest_path(&a.config), sha256(new.as_bytes()))
        .with_context(|| format!("writing {}", digest_path(&a.config).display()))?;
    std::fs::write(&a.config, &new).with_context(|| format!("writing {}", a.config.display()))?;
    eprintln!(
        "cordon wrap: {} now starts `cordon serve -m {}` for {}; the original is {} (`cordon unwrap` restores it)",
        a.config.display(),
        manifest.display(),
        replaced.join(", "),
        backup.display()
    );
    Ok(ExitCode::from(exit::OK))
}

pub fn unwrap(a: &UnwrapArgs) -> anyhow::Result<ExitCode> {
    let backup = backup_path(&a.config);
    let original = std::fs::read(&backup).with_context(|| {
        format!(
            "reading the backup {} (was {} wrapped by `cordon wrap`?)",
            backup.display(),
            a.config.display()
        )
    })?;
    let now =
        std::fs::read(&a.config).with_context(|| format!("reading {}", a.config.display()))?;
    let recorded = std::fs::read_to_string(digest_path(&a.config)).unwrap_or_default();
    if recorded.trim() != sha256(&now) && !a.force {
        eprintln!(
            "cordon unwrap: {} changed since `cordon wrap` wrote it: restoring the backup would lose those changes; pass --force to restore it anyway",
            a.config.display()
        );
        return Ok(ExitCode::from(exit::FINDING));
    }
    std::fs::write(&a.config, &original)
        .with_context(|| format!("writing {}", a.config.display()))?;
    std::fs::remove_file(&backup).with_context(|| format!("removing {}", backup.display()))?;
    let _ = std::fs::remove_file(digest_path(&a.config));
    eprintln!("cordon unwrap: {} restored", a.config.display());
    Ok(ExitCode::from(exit::OK))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve() -> Serve {
        Serve {
            cordon: "/usr/local/bin/cordon".into(),
            manifest: "/p/cordon.yaml".into(),
            providers: None,
        }
    }

    #[test]
    fn wrap_edits_codex_toml_keeping_the_rest() {
        let text = "# my settings\nmodel = \"o3\"\n\n[mcp_servers.files]\ncommand = \"node\"\nargs = [\"x.js\"]\n\n[mcp_servers.files.env]\nA = \"1\"\n\n[mcp_servers.other]\ncommand = \"other\"\n";
        let (new, replaced) = wrapped(
            Path::new("config.toml"),
            text,
            Format::Codex,
            &["files".to_string()],
            &serve(),
        )
        .unwrap();
        assert_eq!(replaced, ["files"]);
        assert!(new.starts_with("# my settings\nmodel = \"o3\"\n"), "{new}");
        let v: toml::Value = toml::from_str(&new).unwrap();
        let s = &v["mcp_servers"];
        assert!(s.get("files").is_none(), "{new}");
        assert_eq!(s["other"]["command"].as_str(), Some("other"));
        assert_eq!(
            s["cordon"]["command"].as_str(),
            Some("/usr/local/bin/cordon")
        );
        assert_eq!(s["cordon"]["args"].as_array().unwrap().len(), 3, "{new}");
    }

    #[test]
    fn wrap_keeps_comments_and_the_servers_it_does_not_replace() {
        let text = r#"{
  // my servers
  "servers": {
    "files": {"type": "stdio", "command": "node", "args": ["x.js"]},
    "remote": {"type": "http", "url": "https://example.com/mcp"}, // kept
  },
  "inputs": []
}
"#;
        let (new, replaced) = wrapped(
            Path::new(".vscode/mcp.json"),
            text,
            Format::Vscode,
            &["files".to_string()],
            &serve(),
        )
        .unwrap();
        assert_eq!(replaced, ["files"]);
        assert!(
            new.contains("// my servers") && new.contains("// kept"),
            "{new}"
        );
        let v = formats::parse_jsonc(Path::new("x"), &new).unwrap();
        assert!(v["servers"].get("files").is_none(), "{new}");
        assert_eq!(v["servers"]["remote"]["url"], "https://example.com/mcp");
        assert_eq!(v["servers"]["cordon"]["command"], "/usr/local/bin/cordon");
        assert_eq!(v["servers"]["cordon"]["type"], "stdio");
        assert_eq!(
            v["servers"]["cordon"]["args"],
            serde_json::json!(["serve", "-m", "/p/cordon.yaml"])
        );
    }
}
