//! `cordon`: run every tool an AI agent calls inside a boundary matched to
//! its risk. See `cordon --help`, the README and docs/architecture.md.
#![forbid(unsafe_code)]

mod audit;
mod check;
mod doctor;
mod exit;
mod explain;
mod probe;
mod proxy;
mod run;
mod schema;
mod serve;

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
    /// Run one tool of the manifest in its sandbox: stdin to the tool, its gated stdout to stdout.
    Run {
        /// The tool's name in the manifest.
        tool: String,
        #[command(flatten)]
        manifest: ManifestArg,
        /// Print one JSON object (status, exit_code, signal, duration_ms,
        /// peak_memory_bytes, output_bytes, stderr, reason, output envelope).
        #[arg(long)]
        json: bool,
        /// Run the tool's conformance probes first; refuse to run it if any does not hold.
        #[arg(long)]
        probe_first: bool,
        /// How text output is labelled on stdout.
        #[arg(long, value_enum, default_value = "none")]
        label: run::Label,
        /// Audit log file (`-` for stderr). Default: /var/log/cordon/audit.jsonl
        /// as root, else ~/.local/state/cordon/audit.jsonl.
        #[arg(long, env = "CORDON_AUDIT")]
        audit: Option<PathBuf>,
    },
    /// Run a command in an ad-hoc P1 jail (no manifest), as one would use bwrap.
    Exec(run::ExecArgs),
    /// Show what this host can enforce, how it was detected, and each profile's strength here.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Run the conformance probes inside each tool's sandbox: HELD, ESCAPED or SKIPPED per probe.
    /// Exit 1 if anything escaped or a positive control failed.
    Probe(probe::ProbeArgs),
    /// Serve the egress proxy door on a host address, with the same checks and audit records.
    Proxy(proxy::ProxyArgs),
    /// Serve the manifest's tools as one MCP server (stdio, or streamable HTTP with --http).
    Serve(serve::ServeArgs),
    /// Read the audit log.
    Audit {
        #[command(subcommand)]
        cmd: audit::AuditCmd,
    },
    /// The probe agent that runs inside a sandbox (used by `cordon probe`).
    #[command(name = "__probe-agent", hide = true)]
    ProbeAgent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    // A one-shot call makes one jail: its first network namespace is
    // started before the arguments are even parsed (see
    // `cordon_jail::start_early`).
    if matches!(
        std::env::args_os().nth(1).as_ref().and_then(|a| a.to_str()),
        Some("exec" | "run")
    ) {
        cordon_jail::start_early();
    }
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
        Cmd::Run {
            tool,
            manifest,
            json,
            probe_first,
            label,
            audit,
        } => run::run_tool(
            &manifest.path,
            &tool,
            &run::RunOpts {
                json,
                probe_first,
                label,
                audit,
            },
        ),
        Cmd::Exec(args) => run::exec_policy(&args).and_then(|p| {
            run::call_and_print(
                &p,
                &run::RunOpts {
                    json: args.json,
                    probe_first: false,
                    label: run::Label::None,
                    audit: args.audit.clone(),
                },
            )
        }),
        Cmd::Doctor { json } => doctor::run(json),
        Cmd::Probe(args) => probe::run(args),
        Cmd::Proxy(args) => proxy::run(args),
        Cmd::Serve(args) => serve::run(&args),
        Cmd::Audit { cmd } => audit::run(cmd),
        Cmd::ProbeAgent { args } => {
            let code = cordon_probes::agent::main(&args);
            return ExitCode::from(u8::try_from(code).unwrap_or(exit::USAGE));
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("cordon: {e:#}");
            ExitCode::from(exit::USAGE)
        }
    }
}
