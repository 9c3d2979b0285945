//! `cordon proxy`: the egress proxy door on a host address, for tools that
//! run outside cordon and for testing an allowlist. Same checks, same audit
//! records as the doors of a sandbox.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::anyhow;

use cordon_audit::{AuditLog, AuditRecord, FileSink, Rotation, StderrSink};
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
    let path = match a
        .audit
        .clone()
        .map_or_else(cordon_broker::default_audit_path, Ok)
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cordon: warning: {e}; records go to stderr");
            PathBuf::from("-")
        }
    };
    let mut log = AuditLog::new().with_sink(StderrSink);
    if path.as_os_str() != "-" {
        if let Some(d) = path.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        match FileSink::open(&path, Rotation::default()) {
            Ok(s) => log = AuditLog::new().with_sink(s),
            Err(e) => eprintln!(
                "cordon: warning: audit log {} cannot be opened ({e}); records go to stderr",
                path.display()
            ),
        }
    }
    let log = Arc::new(log);
    let name = a.name.clone();
    let sink = EventSink::new(move |e| {
        eprintln!(
            "cordon proxy: {:?} {}:{} {}",
            e.decision, e.name, e.port, e.reason
        );
        let mut r = AuditRecord::new(&name, "proxy");
        r.runtime = "proxy".into();
        r.session = e.session.clone();
        r.caller = "proxy".into();
        r.duration_ms = e.duration_ms;
        r.egress.push(cordon_broker::audit_event(&e));
        if e.decision == cordon_egress::Decision::Refused {
            r.status = cordon_audit::Status::Denied;
            r.reason = Some(e.reason.clone());
        }
        if let Err(err) = log.record(&r) {
            eprintln!("cordon: warning: audit record not written: {err}");
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
    rt.block_on(cordon_egress::run_proxy(a.listen, p, ctx, sink))
        .map_err(|e| anyhow!("{e}"))?;
    Ok(ExitCode::from(exit::OK))
}
