//! `cordon serve`: the MCP gateway. One MCP server stands in for every tool
//! of the manifest; each call runs in the sandbox its profile names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use anyhow::anyhow;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions, JailSandbox, Transport};
use cordon_policy::policy::{Exec, Network, Runtime};

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
    /// Do not run the conformance probes at start. By default a command
    /// tool whose sandbox has a probe that does not hold is not served.
    #[arg(long)]
    pub no_probe: bool,
}

/// Probe every command tool's sandbox, in parallel, and drop each tool
/// with a probe that does not hold, saying which. The wall clock of a
/// probed sandbox is shortened to 3 s so start-up stays quick; the
/// mechanism under test is the same.
fn probe_and_filter(
    set: &mut cordon_policy::PolicySet,
    jail: &Arc<cordon_jail::Jail>,
) -> Vec<String> {
    let probed: Vec<_> = set
        .tools
        .values()
        .filter(|p| {
            matches!(p.exec, Exec::Command { .. })
                && p.runtime == Runtime::Native
                && p.network == Network::None
                && p.limits.is_some()
        })
        .cloned()
        .collect();
    let results: Vec<(String, anyhow::Result<()>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = probed
            .into_iter()
            .map(|mut p| {
                let jail = jail.clone();
                sc.spawn(move || {
                    if let Some(l) = p.limits.as_mut() {
                        l.wall_seconds = l.wall_seconds.min(3);
                    }
                    let r = crate::probe::probe_tool(&p, jail).map(|_| ());
                    (p.name.clone(), r)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut refused = Vec::new();
    for (name, r) in results {
        if let Err(e) = r {
            set.tools.remove(&name);
            refused.push(format!("{e:#}"));
        }
    }
    refused
}

pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let opts = GatewayOptions {
        audit: args.audit.clone(),
        ..GatewayOptions::default()
    };
    let gw = if args.no_probe {
        eprintln!(
            "cordon: warning: --no-probe: tools are served without checking that their sandboxes hold here"
        );
        Gateway::from_manifest(&args.manifest.path, &opts).map_err(|e| anyhow!("{e}"))?
    } else {
        let mut loaded = cordon_policy::load(&args.manifest.path).map_err(|e| anyhow!("{e}"))?;
        let jail = Arc::new(cordon_jail::Jail::new().map_err(|e| anyhow!("{e}"))?);
        for refusal in probe_and_filter(&mut loaded.policy, &jail) {
            eprintln!("cordon: {refusal}");
        }
        let broker = cordon_broker::Broker::new(opts.audit.clone()).map_err(|e| anyhow!("{e}"))?;
        let sandbox = Arc::new(
            JailSandbox::new(jail, opts.max_server_lifetime)
                .with_audit(Arc::new(cordon_broker::open_audit(opts.audit.clone()).0)),
        );
        Gateway::new(&loaded.policy, broker, sandbox).map_err(|e| anyhow!("{e}"))?
    };
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
