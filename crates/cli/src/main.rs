//! `cordon`: run every tool an AI agent calls inside a boundary matched to
//! its risk. See `cordon --help`, the README and docs/architecture.md.
#![forbid(unsafe_code)]

mod check;
mod exit;
mod explain;
mod schema;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// cordon runs each tool an agent calls inside the sandbox its manifest
/// names (P1 parser jail, P2 MCP server with an egress allowlist, P3 fresh
/// runtime), gates what comes back, and proves the boundary holds.
#[derive(Parser)]
#[command(name = "cordon", version, about, long_about = None)]
#[command(
    after_help = "Start with `cordon check -m examples/cordon.yaml`, then \
`cordon explain pdf_to_text -m examples/cordon.yaml` and `cordon doctor`."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Clone)]
struct ManifestArg {
    /// The manifest (YAML). Default: $CORDON_MANIFEST, else ./cordon.yaml.
    #[arg(
        short = 'm',
        long = "manifest",
        env = "CORDON_MANIFEST",
        default_value = "cordon.yaml"
    )]
    path: PathBuf,
}

#[derive(Subcommand)]
enum Cmd {
    /// Validate a manifest: one line per tool, then the warnings. Exit 1 if invalid.
    Check {
        #[command(flatten)]
        manifest: ManifestArg,
    },
    /// Print one tool's resolved policy: every effective setting after defaults.
    Explain {
        /// The tool's name in the manifest.
        tool: String,
        #[command(flatten)]
        manifest: ManifestArg,
        /// JSON instead of YAML.
        #[arg(long)]
        json: bool,
    },
    /// Compare two manifests' resolved policies. Exit 1 if any change weakens isolation.
    Diff {
        old: PathBuf,
        new: PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the manifest's JSON Schema (for editors).
    Schema,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Check { manifest } => check::run(&manifest.path),
        Cmd::Explain {
            tool,
            manifest,
            json,
        } => explain::explain(&manifest.path, &tool, json),
        Cmd::Diff { old, new, json } => explain::diff(&old, &new, json),
        Cmd::Schema => schema::run(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cordon: {e:#}");
            ExitCode::from(exit::USAGE)
        }
    }
}
