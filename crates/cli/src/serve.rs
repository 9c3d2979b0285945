//! `cordon serve`: the MCP gateway. One MCP server stands in for every tool
//! of the manifest; each call runs in the sandbox its profile names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions, Transport};

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub manifest: crate::ManifestArg,
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:8765; port 0
    /// picks one) at /mcp instead of stdio. Only loopback `Host` headers are
    /// accepted unless --allow-host adds more.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Another `Host` value the HTTP transport accepts (DNS-rebinding check).
    #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
    pub allow_host: Vec<String>,
    /// Audit log file (`-` for stderr). Default: /var/log/cordon/audit.jsonl
    /// as root, else ~/.local/state/cordon/audit.jsonl.
    #[arg(long, env = "CORDON_AUDIT")]
    pub audit: Option<PathBuf>,
}

pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let opts = GatewayOptions {
        audit: args.audit.clone(),
        ..GatewayOptions::default()
    };
    let gw = Gateway::from_manifest(&args.manifest.path, &opts).map_err(|e| anyhow!("{e}"))?;
    for w in gw.warnings() {
        eprintln!("cordon: warning: {w}");
    }
    let transport = match args.http {
        Some(addr) => Transport::Http {
            addr,
            opts: HttpOptions {
                extra_allowed_hosts: args.allow_host.clone(),
            },
        },
        None => Transport::Stdio,
    };
    let tools = gw.tool_names().join(", ");
    cordon_mcp::run(gw, transport, |ready| {
        eprintln!("cordon: {ready} (tools: {tools})");
    })
    .map_err(|e| anyhow!("{e}"))?;
    Ok(ExitCode::SUCCESS)
}
