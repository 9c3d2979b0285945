//! `cordon`: run every tool an AI agent calls inside a boundary matched to
//! its risk. See `cordon --help`, the README and docs/architecture.md.
#![forbid(unsafe_code)]

mod add;
mod audit;
mod check;
mod credentials;
mod doctor;
mod doctor_pools;
mod exit;
mod explain;
mod image;
mod import;
mod interrupt;
mod inventory;
mod key;
mod probe;
mod proof;
mod proxy;
mod render;
mod report;
mod reprobe;
mod run;
mod schema;
mod serve;
mod shims;
mod state;
mod token;
mod tool_state;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// cordon runs each tool an agent calls inside the sandbox its manifest
/// names (P1 parser jail, P2 MCP server with an egress allowlist, P3 fresh
/// runtime), gates what comes back, and proves the boundary holds.
#[derive(Parser)]
#[command(name = "cordon", version, about, long_about = None)]
#[command(
    after_help = "Start with `cordon doctor` (what this host enforces). Then either \
`cordon import` (a manifest from your MCP client's configuration) and `cordon wrap` (the client \
pointed at `cordon serve`), or `cordon schema --example > cordon.yaml` (the bundled example), \
`cordon check -m cordon.yaml` and `cordon explain pdf_to_text -m cordon.yaml`."
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

const RUN_ABOUT: &str =
    "Run one tool of the manifest in its sandbox: stdin to the tool, its gated stdout to stdout";
const EXEC_ABOUT: &str = "Run a command in an ad-hoc P1 jail (no manifest), as one would use bwrap";

#[derive(clap::Args)]
struct RunArgs {
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
    /// Go on when the audit record cannot be written (default: the call
    /// fails with status 22 and its output is withheld).
    #[arg(long, env = "CORDON_AUDIT_FAIL_OPEN")]
    audit_fail_open: bool,
    /// The credential broker's provider file, read when the tool declares
    /// secrets. Default: /etc/cordon/providers.yaml.
    #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
    providers: Option<PathBuf>,
}

/// `cordon run` alone: parsed without building every other subcommand
/// (see [`one_shot_command`]).
#[derive(Parser)]
#[command(name = "run", bin_name = "cordon run", about = RUN_ABOUT)]
struct RunOnly {
    #[command(flatten)]
    args: RunArgs,
}

/// `cordon exec` alone (see [`one_shot_command`]).
#[derive(Parser)]
#[command(name = "exec", bin_name = "cordon exec", about = EXEC_ABOUT)]
struct ExecOnly {
    #[command(flatten)]
    args: run::ExecArgs,
}

/// `cordon run` and `cordon exec`, the commands a caller may start once per
/// tool call, are parsed by a parser of their own: building the whole
/// command line (every subcommand and its flags) took about 0.3 ms of a
/// one-shot call's start-up. Same flags, help and errors as through
/// [`Cli`] (test `one_shot_parsers_match_the_full_cli`). Such a call makes
/// one jail, whose first network namespace is started before the
/// arguments are even parsed (see `cordon_jail::start_early`).
fn one_shot_command() -> Option<Cmd> {
    let mut args = std::env::args_os();
    let _cordon = args.next()?;
    let sub = args.next()?;
    let name = sub
        .to_str()
        .filter(|s| matches!(*s, "run" | "exec"))?
        .to_string();
    cordon_jail::start_early();
    let rest = std::iter::once(sub).chain(args);
    Some(match name.as_str() {
        "run" => Cmd::Run(RunOnly::parse_from(rest).args),
        _ => Cmd::Exec(ExecOnly::parse_from(rest).args),
    })
}

#[derive(Subcommand)]
enum Cmd {
    /// Validate a manifest and admit each tool on this host: one line per
    /// tool, then the warnings. Exit 1 if invalid or a tool would not start here.
    Check {
        #[command(flatten)]
        manifest: ManifestArg,
        /// Only validate the manifest: do not admit its tools on this host.
        #[arg(long)]
        no_host: bool,
        /// The credential broker's provider file (checked when a tool
        /// declares secrets). Default: /etc/cordon/providers.yaml.
        #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
        providers: Option<PathBuf>,
    },
    /// Print one tool's resolved policy: every effective setting after defaults
    /// (without a tool: the gateway's session lifetime and caps).
    Explain {
        /// The tool's name in the manifest (absent: the `gateway` section,
        /// session lifetime and caps of `cordon serve`).
        tool: Option<String>,
        #[command(flatten)]
        manifest: ManifestArg,
        /// JSON instead of YAML.
        #[arg(long)]
        json: bool,
        /// The provider file that names the default provider.
        #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
        providers: Option<PathBuf>,
    },
    /// Compare two manifests' resolved policies. Exit 1 if any change weakens isolation.
    Diff {
        old: PathBuf,
        new: PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the manifest's JSON Schema (for editors), or with `--example` the bundled example manifest.
    Schema {
        /// Print the bundled example manifest instead (the seed's support-agent tools).
        #[arg(long)]
        example: bool,
    },
    #[command(about = RUN_ABOUT)]
    Run(RunArgs),
    #[command(about = EXEC_ABOUT)]
    Exec(run::ExecArgs),
    /// Show what this host can enforce, how it was detected, and each profile's strength here.
    Doctor {
        #[arg(long)]
        json: bool,
        /// The credential broker's provider file. Default:
        /// /etc/cordon/providers.yaml.
        #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
        providers: Option<PathBuf>,
        /// The manifest whose pools (`mcp: {warm: N}`, `lifetime: pool`)
        /// are shown, with their live state in a running `cordon serve`.
        /// Default: $CORDON_MANIFEST, else ./cordon.yaml if it exists.
        #[arg(short = 'm', long = "manifest", env = "CORDON_MANIFEST")]
        manifest: Option<PathBuf>,
    },
    /// Run the conformance probes inside each tool's sandbox: HELD, ESCAPED or SKIPPED per probe.
    /// Exit 1 if anything escaped or a positive control failed.
    Probe(probe::ProbeArgs),
    /// The image store: pull, load, ls, inspect, rm, gc.
    Image(image::ImageArgs),
    /// Serve the egress proxy door on a host address, with the same checks and audit records.
    Proxy(proxy::ProxyArgs),
    /// Serve the manifest's tools as one MCP server (stdio, or streamable HTTP with --http).
    Serve(serve::ServeArgs),
    /// Write a manifest from MCP client configurations (Claude Desktop,
    /// Claude Code, Cursor, VS Code, Windsurf, Zed, Continue, Gemini CLI,
    /// Codex): one `mcp:` tool per server, each proposal's reason as a comment.
    Import(import::ImportArgs),
    /// Point a client configuration at `cordon serve` for the servers
    /// imported into a manifest (a backup is kept; the diff is printed).
    Wrap(import::wrap::WrapArgs),
    /// Restore a client configuration that `cordon wrap` changed, byte for byte.
    Unwrap(import::wrap::UnwrapArgs),
    /// One table of every tool: what it parses and reaches, its secrets,
    /// profile, runtime and mechanisms, whether this host enforces it, and
    /// when `cordon probe` last passed for it.
    Inventory(inventory::InventoryArgs),
    /// Install an MCP server from npm or PyPI into cordon's store and add its
    /// `mcp:` tool to the manifest (or print it).
    Add(add::AddArgs),
    /// The tools' per-tenant state (`state:`): ls, rm.
    State {
        #[command(subcommand)]
        cmd: tool_state::StateCmd,
    },
    /// Static bearer tokens for `serve --http --auth`.
    Token {
        #[command(subcommand)]
        cmd: token::TokenCmd,
    },
    /// The host key that signs probe reports: init, show.
    Key {
        #[command(subcommand)]
        cmd: key::KeyCmd,
    },
    /// Signed probe reports (`cordon probe --report`): verify.
    Report {
        #[command(subcommand)]
        cmd: report::ReportCmd,
    },
    /// Render what a manifest needs elsewhere: `kubernetes` (the objects, as YAML).
    Render {
        #[command(subcommand)]
        cmd: render::RenderCmd,
    },
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
    let cmd = one_shot_command().unwrap_or_else(|| Cli::parse().cmd);
    let result = match cmd {
        Cmd::Check {
            manifest,
            no_host,
            providers,
        } => check::run(&manifest.path, !no_host, providers.as_deref()),
        Cmd::Explain {
            tool,
            manifest,
            json,
            providers,
        } => match tool {
            Some(tool) => explain::explain(&manifest.path, &tool, json, providers.as_deref()),
            None => explain::explain_gateway(&manifest.path, json),
        },
        Cmd::Diff { old, new, json } => explain::diff(&old, &new, json),
        Cmd::Schema { example } => schema::run(example),
        Cmd::Run(RunArgs {
            tool,
            manifest,
            json,
            probe_first,
            label,
            audit,
            audit_fail_open,
            providers,
        }) => run::run_tool(
            &manifest.path,
            &tool,
            &run::RunOpts {
                json,
                probe_first,
                label,
                audit,
                audit_fail_open,
                providers,
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
                    audit_fail_open: args.audit_fail_open,
                    providers: None,
                },
            )
        }),
        Cmd::Doctor {
            json,
            providers,
            manifest,
        } => doctor::run(json, providers.as_deref(), manifest.as_deref()),
        Cmd::Probe(args) => probe::run(args),
        Cmd::Image(args) => image::run(args),
        Cmd::Proxy(args) => proxy::run(args),
        Cmd::Serve(args) => serve::run(&args),
        Cmd::Import(args) => import::run(&args),
        Cmd::Wrap(args) => import::wrap::wrap(&args),
        Cmd::Unwrap(args) => import::wrap::unwrap(&args),
        Cmd::Inventory(args) => inventory::run(&args),
        Cmd::Add(args) => add::run(&args),
        Cmd::Audit { cmd } => audit::run(cmd),
        Cmd::Render { cmd } => render::run(cmd),
        Cmd::State { cmd } => tool_state::run(cmd),
        Cmd::Token { cmd } => token::run(cmd),
        Cmd::Key { cmd } => key::run(cmd),
        Cmd::Report { cmd } => report::run(cmd),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn full_help(name: &str) -> String {
        let mut cli = Cli::command();
        cli.build();
        let sub = cli.find_subcommand_mut(name).expect("subcommand");
        sub.render_long_help().to_string()
    }

    fn full_error(argv: &[&str]) -> Option<String> {
        let argv = std::iter::once("cordon").chain(argv.iter().copied());
        Cli::try_parse_from(argv)
            .err()
            .map(|e| e.render().to_string())
    }

    fn fast_error(argv: &[&str]) -> Option<String> {
        let e = match argv[0] {
            "exec" => ExecOnly::try_parse_from(argv).err(),
            _ => RunOnly::try_parse_from(argv).err(),
        };
        e.map(|e| e.render().to_string())
    }

    #[test]
    fn one_shot_parsers_match_the_full_cli() {
        assert_eq!(
            ExecOnly::command().render_long_help().to_string(),
            full_help("exec")
        );
        assert_eq!(
            RunOnly::command().render_long_help().to_string(),
            full_help("run")
        );
        for argv in [
            &["exec"][..],
            &["exec", "--bogus", "--", "x"],
            &["exec", "--memory"],
            &["exec", "--help"],
            &["run"],
            &["run", "--label", "xx", "t"],
            &["run", "--help"],
            &["exec", "--memory", "64M", "--", "/bin/true"],
            &["run", "t", "--json", "-m", "m.yaml"],
        ] {
            assert_eq!(fast_error(argv), full_error(argv), "{argv:?}");
        }
        // The same values through both.
        let argv = [
            "exec",
            "--memory",
            "64M",
            "--env",
            "A=1",
            "--",
            "/bin/echo",
            "x",
        ];
        let fast = ExecOnly::try_parse_from(argv).unwrap().args;
        let Cmd::Exec(full) = Cli::try_parse_from(std::iter::once("cordon").chain(argv))
            .unwrap()
            .cmd
        else {
            panic!("not exec");
        };
        assert_eq!(format!("{fast:?}"), format!("{full:?}"));
    }
}
