//! `cordon serve`: the MCP gateway. One MCP server stands in for every tool
//! of the manifest; each call runs in the sandbox its profile names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use anyhow::anyhow;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions, Transport};
use cordon_runtime::Registry;

#[derive(clap::Args, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub manifest: crate::ManifestArg,
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:8765; port 0
    /// picks one) at /mcp instead of stdio. Only loopback `Host` headers are
    /// accepted unless --allow-host adds more.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// End an HTTP session after this many seconds with no request and no
    /// call in flight (instead of the manifest's `gateway: {idle_timeout}`,
    /// default 300).
    #[arg(long, value_name = "SECONDS", requires = "http", value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout: Option<u64>,
    /// Another `Host` value the HTTP transport accepts (DNS-rebinding check).
    #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
    pub allow_host: Vec<String>,
    /// Audit log file (`-` for stderr). Default: /var/log/cordon/audit.jsonl
    /// as root, else ~/.local/state/cordon/audit.jsonl.
    #[arg(long, env = "CORDON_AUDIT")]
    pub audit: Option<PathBuf>,
    /// Do not run the conformance probes at start. By default every tool
    /// (command tools and each `mcp:` server's sandbox) is probed, and one
    /// whose probe does not hold, errs or cannot run is not served.
    #[arg(long)]
    pub no_probe: bool,
    /// Go on when an audit record cannot be written (default: the call
    /// fails and its result is withheld).
    #[arg(long, env = "CORDON_AUDIT_FAIL_OPEN")]
    pub audit_fail_open: bool,
    /// The credential broker's provider file, read when a tool declares
    /// secrets. Default: /etc/cordon/providers.yaml.
    #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
    pub providers: Option<PathBuf>,
}

/// Probe every tool's own sandbox (command tools with or without egress,
/// and each `mcp:` server's), in parallel, and drop each tool whose probes
/// do not all hold, that cannot be probed, or whose probe thread failed,
/// saying which. P0 tools are never served, so never probed. The wall clock
/// of a probed sandbox is shortened to 3 s so start-up stays quick; the
/// mechanism under test is the same.
pub fn probe_and_filter(set: &mut cordon_policy::PolicySet, registry: &Registry) -> Vec<String> {
    let probed: Vec<_> = set
        .tools
        .values()
        .filter(|p| p.profile != cordon_policy::policy::Profile::P0)
        .cloned()
        .collect();
    let results: Vec<(String, anyhow::Result<()>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = probed
            .into_iter()
            .map(|mut p| {
                let name = p.name.clone();
                let h = sc.spawn(move || {
                    if let Some(l) = p.limits.as_mut() {
                        l.wall_seconds = l.wall_seconds.min(3);
                    }
                    crate::probe::probe_tool(&p, registry).map(|_| ())
                });
                (name, h)
            })
            .collect();
        handles
            .into_iter()
            .map(|(name, h)| {
                let r = h.join().unwrap_or_else(|panic| {
                    let what = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "no message".into());
                    Err(anyhow!(
                        "{name}: refusing to start: its probe run failed ({what})"
                    ))
                });
                (name, r)
            })
            .collect()
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
        audit_fail_open: args.audit_fail_open,
        ..GatewayOptions::default()
    };
    let mut loaded = cordon_policy::load(&args.manifest.path).map_err(|e| anyhow!("{e}"))?;
    let credentials =
        crate::run::credentials_for(loaded.policy.tools.values(), args.providers.as_deref())?;
    let mut registry = Registry::for_host(Default::default());
    if let Some(cb) = &credentials {
        registry = registry.with_credentials(cb.clone());
    }
    if args.no_probe {
        eprintln!(
            "cordon: warning: --no-probe: tools are served without checking that their sandboxes hold here"
        );
    } else {
        for refusal in probe_and_filter(&mut loaded.policy, &registry) {
            eprintln!("cordon: {refusal}");
        }
    }
    let bopts = cordon_broker::BrokerOptions {
        audit: opts.audit.clone(),
        audit_fail_open: opts.audit_fail_open,
        credentials: credentials.clone(),
        ..Default::default()
    };
    let broker =
        cordon_broker::Broker::with_registry(registry, &bopts).map_err(|e| anyhow!("{e}"))?;
    let sandbox = Arc::new(cordon_mcp::servers_for(&broker, &opts).map_err(|e| anyhow!("{e}"))?);
    let gw = Gateway::new(&loaded.policy, broker, sandbox)
        .map_err(|e| anyhow!("{e}"))?
        .with_listing_cache(Some(cordon_mcp::default_listing_dir()));
    for w in gw.warnings() {
        eprintln!("cordon: warning: {w}");
    }
    let transport = match args.http {
        Some(addr) => Transport::Http {
            addr,
            opts: HttpOptions {
                extra_allowed_hosts: args.allow_host.clone(),
                authenticator: None,
                idle_timeout: args.idle_timeout.map(std::time::Duration::from_secs),
            },
        },
        None => Transport::Stdio,
    };
    let tools = gw.tool_names().join(", ");
    let served = cordon_mcp::run(gw, transport, |ready| {
        eprintln!("cordon: {ready} (tools: {tools})");
    });
    // The client went away, or SIGINT/SIGTERM: every session's tokens are
    // revoked before the process exits (the sessions' own ends revoke
    // theirs; this catches any still live).
    if let Some(cb) = &credentials {
        cb.revoke_all("cordon serve is shutting down");
    }
    served.map_err(|e| anyhow!("{e}"))?;
    Ok(ExitCode::SUCCESS)
}
