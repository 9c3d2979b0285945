//! The MCP client configurations `cordon import` reads, each into the same
//! list of [`ClientServer`]s: where each server is declared and what the
//! client would start (or reach) for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde_json::Value;

/// A client configuration's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Claude Desktop's `claude_desktop_config.json` (`mcpServers`).
    ClaudeDesktop,
    /// Claude Code's `.mcp.json` and `~/.claude.json` (`mcpServers`, and
    /// `projects.*.mcpServers`).
    ClaudeCode,
    /// Cursor's `.cursor/mcp.json` (`mcpServers`).
    Cursor,
    /// VS Code's `.vscode/mcp.json` (`servers`, `inputs`; JSON with comments).
    Vscode,
    /// Windsurf's `mcp_config.json` (`mcpServers`).
    Windsurf,
    /// Zed's `settings.json` (`context_servers`; JSON with comments).
    Zed,
    /// Continue's `config.yaml` or `config.json` (`mcpServers`).
    Continue,
    /// Gemini CLI's `settings.json` (`mcpServers`, `httpUrl`).
    Gemini,
    /// Codex's `config.toml` (`[mcp_servers.NAME]`).
    Codex,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::ClaudeDesktop => "claude-desktop",
            Format::ClaudeCode => "claude-code",
            Format::Cursor => "cursor",
            Format::Vscode => "vscode",
            Format::Windsurf => "windsurf",
            Format::Zed => "zed",
            Format::Continue => "continue",
            Format::Gemini => "gemini",
            Format::Codex => "codex",
        }
    }

    /// The key of the object of servers in this format's JSON (for
    /// `wrap`); `None`: not a JSON object of servers.
    pub fn servers_key(self) -> Option<&'static str> {
        match self {
            Format::Vscode => Some("servers"),
            Format::Zed => Some("context_servers"),
            Format::Continue | Format::Codex => None,
            _ => Some("mcpServers"),
        }
    }
}

/// What the client does for one server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// A local process over stdio.
    Stdio {
        command: String,
        args: Vec<String>,
        cwd: Option<String>,
        /// `env` as written (values may hold `${...}` expansions).
        env: BTreeMap<String, String>,
        /// VS Code's `envFile`, when given.
        env_file: Option<String>,
    },
    /// A remote server (streamable HTTP or SSE) at this URL; `field` is the
    /// key it was under (`url`, `httpUrl`, `serverUrl`).
    Remote { url: String, field: String },
    /// Declared without a command or URL (e.g. provided by a Zed extension).
    Nothing,
}

/// A VS Code `inputs` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    pub description: Option<String>,
    pub password: bool,
    pub default: Option<String>,
}

/// One server as declared in a client configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientServer {
    pub name: String,
    pub file: PathBuf,
    pub format: Format,
    /// Where in the file, e.g. `mcpServers.files` (for messages).
    pub at: String,
    pub transport: Transport,
    pub disabled: bool,
    /// The file's VS Code `inputs` (empty elsewhere).
    pub inputs: BTreeMap<String, Input>,
}

/// The format of `path`, from its name and, for the names several clients
/// use, its content.
pub fn detect(path: &Path, text: &str) -> anyhow::Result<Format> {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|f| f.to_str())
        .unwrap_or("");
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let f = match (file, parent) {
        ("claude_desktop_config.json", _) => Format::ClaudeDesktop,
        (".mcp.json" | ".claude.json", _) => Format::ClaudeCode,
        ("mcp.json", ".cursor") => Format::Cursor,
        ("mcp.json", ".vscode") => Format::Vscode,
        ("mcp_config.json", _) => Format::Windsurf,
        ("config.toml", _) => Format::Codex,
        (_, ".continue") | (_, "mcpServers") if ext == "yaml" || ext == "json" => Format::Continue,
        _ if ext == "toml" => Format::Codex,
        _ if ext == "yaml" || ext == "yml" => Format::Continue,
        _ => {
            let v = parse_jsonc(path, text)?;
            if v.get("context_servers").is_some() {
                Format::Zed
            } else if v.get("servers").is_some() {
                Format::Vscode
            } else if v.get("projects").is_some() {
                Format::ClaudeCode
            } else if parent == ".gemini"
                || v.get("mcpServers").is_some_and(|m| {
                    m.as_object()
                        .is_some_and(|o| o.values().any(|s| s.get("httpUrl").is_some()))
                })
            {
                Format::Gemini
            } else if v.get("mcpServers").is_some() {
                Format::ClaudeDesktop
            } else {
                bail!(
                    "{}: not a client configuration cordon knows (no `mcpServers`, `servers`, `context_servers` or `[mcp_servers]`); name its format with --format",
                    path.display()
                );
            }
        }
    };
    Ok(f)
}

/// JSON, with the comments and trailing commas that VS Code, Zed and
/// others allow.
pub fn parse_jsonc(path: &Path, text: &str) -> anyhow::Result<Value> {
    let opts = jsonc_parser::ParseOptions {
        allow_comments: true,
        allow_loose_object_property_names: false,
        allow_trailing_commas: true,
    };
    jsonc_parser::parse_to_serde_value(text, &opts)
        .map_err(|e| anyhow!("{}: not valid JSON: {e}", path.display()))?
        .ok_or_else(|| anyhow!("{}: empty", path.display()))
}

/// Every server `path` declares.
pub fn read(path: &Path, format: Option<Format>) -> anyhow::Result<Vec<ClientServer>> {
    // Absolute: relative paths in the file are taken from its directory.
    let path =
        &std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let format = match format {
        Some(f) => f,
        None => detect(path, &text)?,
    };
    let doc: Value = match format {
        Format::Codex => {
            let t: toml::Value = toml::from_str(&text)
                .map_err(|e| anyhow!("{}: not valid TOML: {e}", path.display()))?;
            serde_json::to_value(t).with_context(|| format!("reading {}", path.display()))?
        }
        Format::Continue if !text.trim_start().starts_with('{') => serde_saphyr::from_str(&text)
            .map_err(|e| anyhow!("{}: not valid YAML: {e}", path.display()))?,
        _ => parse_jsonc(path, &text)?,
    };
    let mut out = Vec::new();
    let mut add = |at: &str, servers: &Value, inputs: &BTreeMap<String, Input>| {
        collect(path, format, at, servers, inputs, &mut out)
    };
    match format {
        Format::Vscode => {
            let inputs = vscode_inputs(doc.get("inputs"));
            // `servers` (the file) or `mcp.servers` (user settings.json).
            if let Some(s) = doc.get("servers") {
                add("servers", s, &inputs)?;
            } else if let Some(s) = doc.get("mcp").and_then(|m| m.get("servers")) {
                let inputs = vscode_inputs(doc.get("mcp").and_then(|m| m.get("inputs")));
                add("mcp.servers", s, &inputs)?;
            }
        }
        Format::Zed => {
            if let Some(s) = doc.get("context_servers") {
                add("context_servers", s, &BTreeMap::new())?;
            }
        }
        Format::Codex => {
            if let Some(s) = doc.get("mcp_servers") {
                add("mcp_servers", s, &BTreeMap::new())?;
            }
        }
        Format::Continue => {
            if let Some(s) = doc.get("mcpServers") {
                add("mcpServers", s, &BTreeMap::new())?;
            }
            if let Some(s) = doc
                .get("experimental")
                .and_then(|e| e.get("modelContextProtocolServers"))
            {
                add(
                    "experimental.modelContextProtocolServers",
                    s,
                    &BTreeMap::new(),
                )?;
            }
        }
        Format::ClaudeCode => {
            if let Some(s) = doc.get("mcpServers") {
                add("mcpServers", s, &BTreeMap::new())?;
            }
            if let Some(projects) = doc.get("projects").and_then(Value::as_object) {
                for (dir, p) in projects {
                    if let Some(s) = p.get("mcpServers") {
                        add(&format!("projects.{dir}.mcpServers"), s, &BTreeMap::new())?;
                    }
                }
            }
        }
        _ => {
            if let Some(s) = doc.get("mcpServers") {
                add("mcpServers", s, &BTreeMap::new())?;
            }
        }
    }
    Ok(out)
}

fn vscode_inputs(v: Option<&Value>) -> BTreeMap<String, Input> {
    let mut out = BTreeMap::new();
    for i in v.and_then(Value::as_array).into_iter().flatten() {
        if let Some(id) = i.get("id").and_then(Value::as_str) {
            out.insert(
                id.to_string(),
                Input {
                    description: i
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    password: i.get("password").and_then(Value::as_bool).unwrap_or(false),
                    default: i.get("default").and_then(Value::as_str).map(str::to_string),
                },
            );
        }
    }
    out
}

/// The servers of one object (name -> server) or list (entries with a
/// `name`) of servers.
fn collect(
    path: &Path,
    format: Format,
    at: &str,
    servers: &Value,
    inputs: &BTreeMap<String, Input>,
    out: &mut Vec<ClientServer>,
) -> anyhow::Result<()> {
    let list: Vec<(String, &Value)> = match servers {
        Value::Object(o) => o.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let name = v
                    .get("name")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("server{}", i + 1));
                (name, v)
            })
            .collect(),
        _ => bail!(
            "{}: `{at}` is neither an object nor a list of servers",
            path.display()
        ),
    };
    for (name, v) in list {
        let here = format!("{at}.{name}");
        let s = server(path, &here, v)?;
        out.push(ClientServer {
            name,
            file: path.to_path_buf(),
            format,
            at: here,
            transport: s.0,
            disabled: s.1,
            inputs: inputs.clone(),
        });
    }
    Ok(())
}

fn strings(path: &Path, at: &str, v: Option<&Value>) -> anyhow::Result<Vec<String>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(s.clone()),
                Value::Number(n) => Ok(n.to_string()),
                Value::Bool(b) => Ok(b.to_string()),
                _ => Err(anyhow!("{}: {at}[{i}] is not a string", path.display())),
            })
            .collect(),
        Some(_) => bail!("{}: {at} is not a list of strings", path.display()),
    }
}

fn string_map(
    path: &Path,
    at: &str,
    v: Option<&Value>,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            for (k, x) in o {
                let s = match x {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    _ => bail!("{}: {at}.{k} is not a string", path.display()),
                };
                out.insert(k.clone(), s);
            }
        }
        Some(_) => bail!("{}: {at} is not an object of strings", path.display()),
    }
    Ok(out)
}

/// One server's transport, and whether it is disabled.
fn server(path: &Path, at: &str, v: &Value) -> anyhow::Result<(Transport, bool)> {
    let disabled = v.get("disabled").and_then(Value::as_bool).unwrap_or(false)
        || v.get("enabled").and_then(Value::as_bool) == Some(false);
    // Continue's JSON: the transport in a `transport` object.
    let v = v.get("transport").filter(|t| t.is_object()).unwrap_or(v);
    for field in ["url", "httpUrl", "serverUrl"] {
        if let Some(u) = v.get(field).and_then(Value::as_str) {
            return Ok((
                Transport::Remote {
                    url: u.to_string(),
                    field: field.to_string(),
                },
                disabled,
            ));
        }
    }
    // Zed: `command: {path, args, env}`.
    let (cmd, args, env) = match v.get("command") {
        Some(Value::Object(c)) => (
            c.get("path").and_then(Value::as_str).map(str::to_string),
            strings(path, &format!("{at}.command.args"), c.get("args"))?,
            string_map(path, &format!("{at}.command.env"), c.get("env"))?,
        ),
        Some(Value::String(c)) => (
            Some(c.clone()),
            strings(path, &format!("{at}.args"), v.get("args"))?,
            string_map(path, &format!("{at}.env"), v.get("env"))?,
        ),
        Some(_) => bail!("{}: {at}.command is not a string", path.display()),
        None => (None, Vec::new(), BTreeMap::new()),
    };
    let Some(command) = cmd else {
        return Ok((Transport::Nothing, disabled));
    };
    let cwd = v
        .get("cwd")
        .or_else(|| v.get("working_directory"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let env_file = v.get("envFile").and_then(Value::as_str).map(str::to_string);
    Ok((
        Transport::Stdio {
            command,
            args,
            cwd,
            env,
            env_file,
        },
        disabled,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonc_comments_and_trailing_commas_are_read() {
        let text = r#"{
  // a line comment with "quotes" and a // inside
  "servers": { /* block */ "a": {"command": "node", "args": ["x//y", "/*z*/"],}, },
}"#;
        let v = parse_jsonc(Path::new("mcp.json"), text).unwrap();
        assert_eq!(v["servers"]["a"]["args"][0], "x//y");
        assert_eq!(v["servers"]["a"]["args"][1], "/*z*/");
    }

    #[test]
    fn formats_are_detected_by_name_and_content() {
        let d = |p: &str, t: &str| detect(Path::new(p), t).unwrap();
        assert_eq!(d("/h/.cursor/mcp.json", "{}"), Format::Cursor);
        assert_eq!(d("/h/.vscode/mcp.json", "{}"), Format::Vscode);
        assert_eq!(
            d("/h/x/settings.json", r#"{"context_servers": {}}"#),
            Format::Zed
        );
        assert_eq!(
            d("/h/.gemini/settings.json", r#"{"mcpServers": {}}"#),
            Format::Gemini
        );
        assert_eq!(d("/h/.codex/config.toml", ""), Format::Codex);
        assert_eq!(d("/h/.continue/config.yaml", ""), Format::Continue);
        assert!(detect(Path::new("/h/x.json"), r#"{"a": 1}"#).is_err());
    }
}
