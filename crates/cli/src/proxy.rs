//! `cordon proxy`: the egress proxy door on a host address, for tools that
//! run outside cordon and for testing an allowlist. Same checks, same audit
//! records as the doors of a sandbox.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::anyhow;

use cordon_egress::{DoorContext, EgressPolicy, EventSink};

use crate::exit;

#[derive(clap::Args, Debug)]
pub struct ProxyArgs {
    /// Address to listen on, e.g. 127.0.0.1:3128.
    #[arg(long)]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub net: crate::run::EgressArgs,
    /// Name used in refusals and audit records.
    #[arg(long, default_value = "proxy")]
    pub name: String,
    /// Audit log file (`-` for stderr only).
    #[arg(long, env = "CORDON_AUDIT")]
    pub audit: Option<PathBuf>,
    /// Go on when the audit log cannot be opened or a record cannot be
    /// written (default: the proxy does not start, or stops, with status 22).
    #[arg(long, env = "CORDON_AUDIT_FAIL_OPEN")]
    pub audit_fail_open: bool,
}

pub fn policy(a: &ProxyArgs) -> anyhow::Result<EgressPolicy> {
    let network = a.net.network()?;
    cordon_runtime::spec::egress_policy_for(&a.name, &network, &crate::run::upstream_dns())
        .map_err(|e| anyhow!("{e}"))?
        .ok_or_else(|| {
            anyhow!("the proxy would allow nothing: give --egress HOST:PORT or --egress-proxy")
        })
}

pub fn run(a: ProxyArgs) -> anyhow::Result<ExitCode> {
    let p = Arc::new(policy(&a)?);
    let (auditor, warning) =
        match cordon_broker::open_auditor(a.audit.clone(), a.audit_fail_open, None) {
            Ok(a) => a,
            Err(e) => {
                eprintln!("cordon: {e}");
                return Ok(ExitCode::from(exit::AUDIT_FAILED));
            }
        };
    if let Some(w) = warning {
        eprintln!("cordon: warning: {w}");
    }
    let auditor = Arc::new(auditor);
    // Fail-closed, a record that cannot be written stops the proxy: the
    // connection it records has closed, but no other goes out unaudited.
    let unaudited = Arc::new(tokio::sync::Notify::new());
    let name = a.name.clone();
    let (log, stop) = (auditor.clone(), unaudited.clone());
    let sink = EventSink::new(move |e| {
        eprintln!(
            "cordon proxy: {:?} {}:{} {}",
            e.decision, e.name, e.port, e.reason
        );
        let r = cordon_broker::egress_record(&name, "proxy", "proxy", "proxy", &e);
        if log.record_after(&r).is_err() && !log.fail_open() {
            stop.notify_one();
        }
    });
    let ctx = DoorContext {
        tool: a.name.clone(),
        session: format!("proxy-{}", std::process::id()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    eprintln!("cordon proxy: listening on {}", a.listen);
    let stopped = rt.block_on(async {
        tokio::select! {
            r = cordon_egress::run_proxy(a.listen, p, ctx, sink) => r.map(|()| false),
            _ = unaudited.notified() => Ok(true),
        }
    });
    if stopped.map_err(|e| anyhow!("{e}"))? {
        eprintln!(
            "cordon proxy: stopped: an audit record could not be written, and no egress goes out unaudited (--audit-fail-open to go on without it)"
        );
        return Ok(ExitCode::from(exit::AUDIT_FAILED));
    }
    Ok(ExitCode::from(exit::OK))
}
