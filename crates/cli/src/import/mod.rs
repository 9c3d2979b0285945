//! `cordon import`: MCP client configurations (Claude Desktop, Claude
//! Code, Cursor, VS Code, Windsurf, Zed, Continue, Gemini CLI, Codex) to a
//! manifest with one `mcp:` tool per server, each proposal's reason as a
//! comment (docs/import.md). `cordon wrap`/`unwrap` ([`wrap`]) point a
//! client at `cordon serve` and back.

pub mod emit;
pub mod formats;
pub mod known;
pub mod map;
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
    if !to_stdout && a.output.exists() && !a.force {
        return Err(anyhow!(
            "{} exists; pass --force to overwrite it, or -o another file",
            a.output.display()
        ));
    }
    let mut servers = Vec::new();
    for f in &a.files {
        servers.extend(formats::read(f, a.format)?);
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
    let mut cx = map::Ctx {
        store: &store,
        pypi_store: &pypi_store,
        env: &env,
        ask,
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
