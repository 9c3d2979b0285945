//! `cordon import`: MCP client configurations (Claude Desktop, Claude
//! Code, Cursor, VS Code, Windsurf, Zed, Continue, Gemini CLI, Codex) to a
//! manifest with one `mcp:` tool per server, each proposal's reason as a
//! comment (docs/import.md). `cordon wrap`/`unwrap` ([`wrap`]) point a
//! client at `cordon serve` and back.

pub mod emit;
pub mod formats;
pub mod known;
pub mod map;
pub mod resolutions;
pub mod splice;
pub mod wrap;

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow};

use crate::exit;

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// Client configurations to read (their servers are merged into one manifest).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Their format (default: detected from each file's name and content).
    #[arg(long, value_enum)]
    pub format: Option<formats::Format>,
    /// Where the manifest is written (`-`: stdout).
    #[arg(short = 'o', long = "output", default_value = "cordon.yaml")]
    pub output: PathBuf,
    /// Take every default; ask nothing (also when not on a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Overwrite the output when it exists.
    #[arg(long)]
    pub force: bool,
    /// Leave this server out (by its name in the client configuration). Repeatable.
    #[arg(long = "skip", value_name = "NAME")]
    pub skip: Vec<String>,
    /// Import only this server (by its name in the client configuration,
    /// or its tool name). Repeatable. When the output exists, each named
    /// tool's block in it is replaced, or added, and every other byte is
    /// kept (no --force needed).
    #[arg(long = "only", value_name = "NAME")]
    pub only: Vec<String>,
    /// cordon's package store, where `npx` and `uvx` servers are installed
    /// once (the store of `cordon add`). Default: $CORDON_STORE/store, else
    /// /var/lib/cordon/store as root, else ~/.local/share/cordon/store.
    #[arg(long, value_name = "DIR", env = "CORDON_PACKAGE_STORE")]
    pub package_store: Option<PathBuf>,
    /// Install `npx`/`uvx` servers without the network: npm from its cache,
    /// pip from a directory of wheels (see --npm-cache, --wheels).
    #[arg(long)]
    pub offline: bool,
    /// The npm cache to install from (implies --offline for npm packages).
    #[arg(long, value_name = "DIR")]
    pub npm_cache: Option<PathBuf>,
    /// The directory of wheels to install from (implies --offline for PyPI
    /// packages; PyPI installs offline need it).
    #[arg(long, value_name = "DIR")]
    pub wheels: Option<PathBuf>,
    /// Resolve `npx`/`uvx` packages again, not reusing the resolutions an
    /// earlier import stored in cordon's state directory.
    #[arg(long)]
    pub refresh: bool,
}

/// Questions on the terminal (stderr), answers from stdin.
struct Terminal;

impl map::Ask for Terminal {
    fn ask(&mut self, question: &str, default: &str) -> String {
        let mut err = std::io::stderr();
        let _ = write!(err, "{question} ({default}): ");
        let _ = err.flush();
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(n) if n > 0 && !line.trim().is_empty() => line.trim().to_string(),
            _ => default.to_string(),
        }
    }
}

pub fn run(a: &ImportArgs) -> anyhow::Result<ExitCode> {
    let to_stdout = a.output == Path::new("-");
    // --only into an existing manifest: its named blocks are replaced.
    let update = !a.only.is_empty() && !to_stdout && a.output.exists();
    if !to_stdout && !update && a.output.exists() && !a.force {
        return Err(anyhow!(
            "{} exists; pass --force to overwrite it, or -o another file",
            a.output.display()
        ));
    }
    let mut servers = Vec::new();
    for f in &a.files {
        servers.extend(formats::read(f, a.format)?);
    }
    if !a.only.is_empty() {
        only(a, &mut servers)?;
    }
    let mut skipped: Vec<String> = Vec::new();
    servers.retain(|s| {
        if a.skip.contains(&s.name) {
            skipped.push(format!("{} (--skip)", s.name));
            false
        } else if s.disabled {
            skipped.push(format!("{} (disabled in {})", s.name, s.file.display()));
            false
        } else {
            true
        }
    });
    let (servers, mut refused) = map::group(servers);
    let env: BTreeMap<String, String> = std::env::vars().collect();
    let root = match &a.package_store {
        Some(d) => d.clone(),
        None => cordon_store::Store::default_root()?,
    };
    let source = |from: &Option<PathBuf>| {
        if a.offline || from.is_some() {
            cordon_store::Source::Offline { from: from.clone() }
        } else {
            cordon_store::Source::Network
        }
    };
    let store = cordon_store::Store::at(root.clone()).with_source(source(&a.npm_cache));
    let pypi_store = cordon_store::Store::at(root).with_source(source(&a.wheels));
    let interactive = !a.yes && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let mut term = Terminal;
    let mut defaults = map::Defaults;
    let ask: &mut dyn map::Ask = if interactive {
        &mut term
    } else {
        &mut defaults
    };
    let mut resolutions = resolutions::Resolutions::load(crate::state::state_dir().ok());
    let mut cx = map::Ctx {
        store: &store,
        pypi_store: &pypi_store,
        env: &env,
        ask,
        resolutions: &mut resolutions,
        refresh: a.refresh,
    };
    let mut entries = Vec::new();
    for (s, also) in &servers {
        match map::map(s, &mut cx) {
            Ok(mut e) => {
                for x in also {
                    e.notes.insert(1, format!("Also in {x}, the same server."));
                }
                entries.push(e);
            }
            Err(r) => refused.push(r),
        }
    }
    if let Err(e) = resolutions.save() {
        eprintln!("cordon import: warning: the package resolutions were not stored: {e:#}");
    }
    if !refused.is_empty() {
        for r in &refused {
            eprintln!("cordon import: {r}");
        }
        eprintln!(
            "cordon import: {} server(s) cannot be mapped; nothing written (leave them out with --skip NAME)",
            refused.len()
        );
        return Ok(ExitCode::from(exit::FINDING));
    }
    if update {
        return update_manifest(&a.output, &entries);
    }
    let mut header = vec![
        "Written by `cordon import` from:".to_string(),
        a.files
            .iter()
            .map(|f| format!("  {}", f.display()))
            .collect::<Vec<_>>()
            .join("\n"),
        "Each proposal's reason is the comment above it: review them, then `cordon check`.".into(),
    ];
    if !skipped.is_empty() {
        header.push(format!("Not imported: {}.", skipped.join(", ")));
    }
    if !a.only.is_empty() {
        header.push(format!("Only {} (--only).", a.only.join(", ")));
    }
    let text = emit::manifest(&header, &entries);
    // What is written must load: the writer and the schema agree.
    if let Err(e) = cordon_policy::load_str(&a.output, &text) {
        return Err(anyhow!(
            "the manifest written for these servers does not load (a bug in cordon import): {e}"
        ));
    }
    if to_stdout {
        print!("{text}");
    } else {
        write_new(&a.output, &text, a.force)?;
        eprintln!(
            "cordon import: wrote {} ({} tool(s)); review it, then `cordon check -m {}`",
            a.output.display(),
            entries.len(),
            a.output.display()
        );
    }
    Ok(ExitCode::from(exit::OK))
}

/// Keep only the servers `--only` names (by their name in the client
/// configuration or their tool name); a name no configuration has, or one
/// that is disabled or also `--skip`ped, is an error naming the servers
/// there are.
fn only(a: &ImportArgs, servers: &mut Vec<formats::ClientServer>) -> anyhow::Result<()> {
    let named = |s: &formats::ClientServer, n: &str| s.name == n || map::tool_name(&s.name) == n;
    for n in &a.only {
        let Some(s) = servers.iter().find(|s| named(s, n)) else {
            let mut have: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
            have.sort_unstable();
            have.dedup();
            let files: Vec<String> = a.files.iter().map(|f| f.display().to_string()).collect();
            return Err(anyhow!(
                "--only {n}: no server `{n}` in {}; {}",
                files.join(", "),
                if have.is_empty() {
                    "it has no server".to_string()
                } else {
                    format!("its servers are: {}", have.join(", "))
                }
            ));
        };
        if a.skip.iter().any(|k| named(s, k)) {
            return Err(anyhow!("--only {n} and --skip {n}: name it once"));
        }
        if s.disabled {
            return Err(anyhow!(
                "--only {n}: `{}` is disabled in {}; enable it there first",
                s.name,
                s.file.display()
            ));
        }
    }
    servers.retain(|s| a.only.iter().any(|n| named(s, n)));
    Ok(())
}

/// `--only` into an existing manifest: the entries' blocks replaced or
/// added (see [`splice`]), the file replaced in one rename with its mode
/// kept, or left as it was when that cannot be done.
fn update_manifest(path: &Path, entries: &[emit::Entry]) -> anyhow::Result<ExitCode> {
    // A symlinked manifest: the file it points to is updated.
    let real =
        std::fs::canonicalize(path).with_context(|| format!("reading {}", path.display()))?;
    let text =
        std::fs::read_to_string(&real).with_context(|| format!("reading {}", path.display()))?;
    let (new, changes) = splice::splice(path, &text, entries)?;
    let dir = real.parent().unwrap_or(Path::new("."));
    let name = real
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.import-{}", std::process::id()));
    let mode = std::fs::metadata(&real)
        .with_context(|| format!("reading {}", path.display()))?
        .permissions();
    let written = write_new(&tmp, &new, true)
        .and_then(|()| {
            std::fs::set_permissions(&tmp, mode)
                .with_context(|| format!("writing {}", tmp.display()))
        })
        .and_then(|()| {
            std::fs::rename(&tmp, &real).with_context(|| format!("replacing {}", path.display()))
        });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("{} is left as it was", path.display())));
    }
    let said: Vec<String> = changes
        .iter()
        .map(|(n, c)| match c {
            splice::Change::Replaced => format!("replaced `{n}`"),
            splice::Change::Added => format!("added `{n}`"),
        })
        .collect();
    eprintln!(
        "cordon import: updated {}: {}; the rest is as it was; review it, then `cordon check -m {}`",
        path.display(),
        said.join(", "),
        path.display()
    );
    Ok(ExitCode::from(exit::OK))
}

/// Write `text` to `path`: refused when it exists unless `force`.
fn write_new(path: &Path, text: &str, force: bool) -> anyhow::Result<()> {
    let mut o = std::fs::OpenOptions::new();
    o.write(true);
    if force {
        o.create(true).truncate(true);
    } else {
        o.create_new(true);
    }
    let mut f = o
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}
