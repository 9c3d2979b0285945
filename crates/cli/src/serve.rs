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
    /// Prove every tool again at start, even one whose last proof still
    /// holds (same policy, binary, programs and host; under a day old).
    #[arg(long, conflicts_with = "no_probe")]
    pub reprove: bool,
    /// Prove every served tool again this often while serving (e.g. 90s,
    /// 30m, 6h), instead of the manifest's `gateway: {reprobe: {every}}`
    /// (default 6h). A tool whose run does not hold is taken out of
    /// service until one holds (docs/probes.md, "Continuous conformance").
    #[arg(long, value_name = "DURATION", conflicts_with = "no_probe", value_parser = reprobe_every)]
    pub reprobe_every: Option<u64>,
    /// Apply a manifest reloaded on SIGHUP even when the change weakens
    /// isolation (by default such a reload is refused, the diff said).
    #[arg(long)]
    pub accept_weakening: bool,
    /// Keep a signed report of every probe run while serving (scheduled,
    /// SIGUSR1, a changed input, a reload) in DIR, the newest 50 per tool
    /// (`cordon report verify` checks one). Default: `reports` in cordon's
    /// state directory when the signing key exists (`cordon key init`).
    #[arg(long, value_name = "DIR")]
    pub reports: Option<std::path::PathBuf>,
    /// The private key that signs those reports (default: report-key.pem
    /// in cordon's configuration directory).
    #[arg(long, value_name = "FILE")]
    pub report_key: Option<std::path::PathBuf>,
    /// Go on when an audit record cannot be written (default: the call
    /// fails and its result is withheld).
    #[arg(long, env = "CORDON_AUDIT_FAIL_OPEN")]
    pub audit_fail_open: bool,
    /// The credential broker's provider file, read when a tool declares
    /// secrets. Default: /etc/cordon/providers.yaml.
    #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
    pub providers: Option<PathBuf>,
    /// Authenticate HTTP callers by bearer token as this authentication
    /// file says (docs/auth.md). Without it every HTTP caller is the
    /// unauthenticated principal.
    #[arg(long, value_name = "FILE", requires = "http")]
    pub auth: Option<PathBuf>,
    /// Serve HTTPS with this certificate chain (PEM; with --tls-key).
    #[arg(long, value_name = "FILE", requires_all = ["http", "tls_key"])]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM, mode 0600).
    #[arg(long, value_name = "FILE", requires_all = ["http", "tls_cert"])]
    pub tls_key: Option<PathBuf>,
    /// Close an HTTP connection whose request head (request line and
    /// headers) has not all arrived within this many seconds of the
    /// connection being ready for it (default 30).
    #[arg(long, value_name = "SECONDS", requires = "http", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: Option<u64>,
    /// Fail an HTTP request whose body has not all arrived within this many
    /// seconds of its head, and close its connection (default 30).
    #[arg(long, value_name = "SECONDS", requires = "http", value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout: Option<u64>,
    /// Close HTTP connections accepted beyond this many open ones that have
    /// had no request authenticated yet (default 128).
    #[arg(long, value_name = "N", requires = "http", value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub max_pending_connections: Option<u64>,
    /// Serve a non-loopback --http address even without authentication
    /// or TLS (said on stderr). Without it that is refused.
    #[arg(long, requires = "http")]
    pub insecure_accept_plaintext: bool,
    /// Also serve the Prometheus metrics at /metrics on this address,
    /// without authentication: a loopback address only (`--http` serves
    /// them at /metrics behind its authentication too).
    #[arg(long, value_name = "ADDR", conflicts_with = "no_metrics")]
    pub metrics: Option<SocketAddr>,
    /// Keep no metrics and no console (`/metrics` and `/console` are not
    /// served): the audit log is the only record.
    #[arg(long)]
    pub no_metrics: bool,
    /// Export OpenTelemetry spans of every call over OTLP/HTTP to this base
    /// URL (`/v1/traces` is appended), e.g. http://127.0.0.1:4318. Without
    /// it, traces are exported when OTEL_EXPORTER_OTLP_ENDPOINT or
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (docs/observability.md).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

/// `--reprobe-every`: a duration as the manifest writes one, not 0.
fn reprobe_every(s: &str) -> Result<u64, String> {
    match cordon_policy::gateway::parse_duration(&cordon_policy::gateway::Duration::Text(
        s.to_string(),
    ))? {
        0 => Err("0 would prove the tools without pause".into()),
        n => Ok(n),
    }
}

/// A start probe's verdict for one tool: its name, `held`, `cached` or
/// `not_proved`, and when it was last proved (Unix time).
pub type Verdict = (String, &'static str, Option<f64>);

/// `--metrics ADDR` is served without authentication: loopback only.
pub fn metrics_exposure(addr: SocketAddr) -> Result<(), String> {
    if addr.ip().is_loopback() {
        Ok(())
    } else {
        Err(format!(
            "refusing to serve metrics on {addr}, which is not a loopback address: --metrics has no authentication; \
             bind a loopback address, or read /metrics on the --http gateway, behind its authentication"
        ))
    }
}

/// Whether `addr` may be served with what protects it: a loopback address
/// always; any other only with both authentication and TLS, unless
/// `insecure` accepts what is missing. `Ok(Some(warning))` when it is served
/// with something missing.
pub fn exposure(
    addr: SocketAddr,
    auth: bool,
    tls: bool,
    insecure: bool,
) -> Result<Option<String>, String> {
    if addr.ip().is_loopback() {
        return Ok(None);
    }
    let mut missing = Vec::new();
    if !auth {
        missing.push("authentication (--auth FILE)");
    }
    if !tls {
        missing.push("TLS (--tls-cert FILE --tls-key FILE)");
    }
    if missing.is_empty() {
        return Ok(None);
    }
    let missing = missing.join(" and ");
    if insecure {
        Ok(Some(format!(
            "warning: --insecure-accept-plaintext: serving {addr}, which is not loopback, without {missing}"
        )))
    } else {
        Err(format!(
            "refusing to serve MCP on {addr}, which is not a loopback address, without {missing}; \
             give them, bind a loopback address, or pass --insecure-accept-plaintext to accept the exposure"
        ))
    }
}

/// The HTTP connection limits the flags ask for, the defaults otherwise.
fn conn_limits(args: &ServeArgs) -> cordon_mcp::ConnLimits {
    let d = cordon_mcp::ConnLimits::default();
    let secs = std::time::Duration::from_secs;
    cordon_mcp::ConnLimits {
        header_timeout: args.header_timeout.map_or(d.header_timeout, secs),
        body_timeout: args.body_timeout.map_or(d.body_timeout, secs),
        max_pending: args
            .max_pending_connections
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(d.max_pending),
    }
}

/// The host of a URL (for the `Host` check), without port or brackets.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match authority.strip_prefix('[') {
        Some(h) => h.split(']').next()?,
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    (!host.is_empty()).then(|| host.to_string())
}

/// One tool's start proof: its name, the key of what it depended on (none
/// when nothing can be cached), and whether it held.
type Proved = (String, Option<String>, anyhow::Result<()>);

/// Probe every tool's own sandbox (command tools with or without egress,
/// and each `mcp:` server's), at most one per core at once, and drop each
/// tool whose probes do not all hold, that cannot be probed, or whose probe
/// thread failed, saying which. A tool whose last proof is in the proof
/// cache with the same key ([`crate::proof`]) is not proved again unless
/// `reprove`. Progress goes to stderr: each tool as it is proved, with how
/// long it took. P0 tools are never served, so never probed. The wall clock
/// of a probed sandbox is shortened to 3 s so start-up stays quick; the
/// mechanism under test is the same. A run whose probes ran out of time
/// is inconclusive and runs again with a longer wall (see
/// [`crate::probe::probe_tool_at_start`]).
pub fn probe_and_filter(
    set: &mut cordon_policy::PolicySet,
    registry: &Registry,
    reprove: bool,
    verdicts: &mut Vec<Verdict>,
) -> Vec<String> {
    use std::sync::Mutex;
    use std::time::{Instant, SystemTime};
    let started = Instant::now();
    let state = match crate::state::state_dir() {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("cordon: the proof cache is off: {e:#}");
            None
        }
    };
    let proofs = match (&state, reprove) {
        (Some(d), false) => crate::proof::load(&crate::proof::cache_file(d)),
        _ => Default::default(),
    };
    let host = crate::proof::Host::detect();
    let now = SystemTime::now();
    let mut queue = Vec::new();
    let mut cached = 0;
    for p in set
        .tools
        .values()
        .filter(|p| p.profile != cordon_policy::policy::Profile::P0)
    {
        let key = host.key(p);
        if let Some(age) = key
            .as_deref()
            .and_then(|k| crate::proof::fresh(&proofs, &p.name, k, now))
        {
            cached += 1;
            verdicts.push((
                p.name.clone(),
                "cached",
                now.checked_sub(age).map(unix_seconds),
            ));
            eprintln!(
                "cordon: {}: held (proved {} ago; policy, programs, binary and host unchanged)",
                p.name,
                crate::proof::age(age)
            );
            continue;
        }
        queue.push((p.clone(), key));
    }
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(queue.len().max(1));
    if !queue.is_empty() {
        eprintln!(
            "cordon: proving {} tool{}, {workers} at a time{}",
            queue.len(),
            if queue.len() == 1 { "" } else { "s" },
            if cached > 0 {
                format!(" ({cached} more proved before)")
            } else {
                String::new()
            }
        );
    }
    queue.reverse();
    let queue = Mutex::new(queue);
    let results: Mutex<Vec<Proved>> = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| {
                loop {
                    let next = match queue.lock() {
                        Ok(mut q) => q.pop(),
                        Err(_) => None,
                    };
                    let Some((p, key)) = next else { break };
                    let name = p.name.clone();
                    let t = Instant::now();
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        crate::probe::probe_tool_at_start(&p, registry).map(|_| ())
                    }))
                    .unwrap_or_else(|panic| {
                        let what = panic
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "no message".into());
                        Err(anyhow!(
                            "{name}: refusing to start: its probe run failed ({what})"
                        ))
                    });
                    let took = t.elapsed().as_secs_f64();
                    match &r {
                        Ok(()) => eprintln!("cordon: {name}: held ({took:.1} s)"),
                        Err(_) => eprintln!("cordon: {name}: not proved ({took:.1} s)"),
                    }
                    if let Ok(mut all) = results.lock() {
                        all.push((name, key, r));
                    }
                }
            });
        }
    });
    let results = results.into_inner().unwrap_or_default();
    let mut refused = Vec::new();
    let mut proved = Vec::new();
    let mut dropped = Vec::new();
    let mut held = 0;
    for (name, key, r) in results {
        match r {
            Ok(()) => {
                held += 1;
                verdicts.push((name.clone(), "held", Some(unix_seconds(now))));
                if let Some(k) = key {
                    proved.push((name, k));
                }
            }
            Err(e) => {
                verdicts.push((name.clone(), "not_proved", None));
                set.tools.remove(&name);
                refused.push(format!("{e:#}"));
                dropped.push(name);
            }
        }
    }
    if let Some(d) = &state
        && (!proved.is_empty() || !dropped.is_empty())
        && let Err(e) = crate::proof::store(d, &proved, &dropped, now)
    {
        eprintln!("cordon: the proof cache was not written: {e:#}");
    }
    eprintln!(
        "cordon: {} of {} tools proved in {:.1} s",
        held + cached,
        held + cached + dropped.len(),
        started.elapsed().as_secs_f64()
    );
    refused
}

/// Makes ahead what each tool's first call would otherwise make
/// ([`cordon_runtime::Runtime::prepare`]: a microVM tool's image disk and
/// template snapshot), so that a served tool's first call costs what every
/// later one does. A tool refused at admission is skipped (the gateway says
/// why); one that cannot be made ready is still served (its first call
/// tries again, and fails as it would have), with one line saying why.
pub fn prepare_tools(set: &cordon_policy::PolicySet, registry: &Registry) {
    for p in set.tools.values() {
        let Ok(admitted) = registry.admit(p, cordon_runtime::Use::of(p)) else {
            continue;
        };
        let t = std::time::Instant::now();
        match admitted.prepare(&cordon_runtime::Context::discard("serve-start")) {
            // Only what took time is worth a line (nothing is made ahead
            // for most runtimes, or it was made before).
            Ok(()) if t.elapsed() >= std::time::Duration::from_millis(100) => eprintln!(
                "cordon: {}: made ready for its first call in {:.1} s ({})",
                p.name,
                t.elapsed().as_secs_f64(),
                admitted.runtime.name()
            ),
            Ok(()) => {}
            Err(e) => eprintln!(
                "cordon: {}: warning: not made ready ahead (its first call tries again): {e}",
                p.name
            ),
        }
    }
}

fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

pub fn run(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = args.metrics {
        metrics_exposure(addr).map_err(|e| anyhow!(e))?;
    }
    // What protects the HTTP door is settled before anything is started.
    let mut authenticator: Option<Arc<cordon_mcp::bearer::BearerAuthenticator>> = None;
    let mut tls = None;
    if let Some(addr) = args.http {
        if let Some(w) = exposure(
            addr,
            args.auth.is_some(),
            args.tls_cert.is_some(),
            args.insecure_accept_plaintext,
        )
        .map_err(|e| anyhow!(e))?
        {
            eprintln!("cordon: {w}");
        }
        if let Some(path) = &args.auth {
            let cfg = cordon_auth::AuthConfig::load(path).map_err(|e| anyhow!("{e}"))?;
            let v = cordon_auth::Validator::from_config(&cfg).map_err(|e| anyhow!(e))?;
            authenticator = Some(Arc::new(cordon_mcp::bearer::BearerAuthenticator::new(
                Arc::new(v),
            )));
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            tls = Some(cordon_mcp::tls_config(cert, key).map_err(|e| anyhow!("{e}"))?);
        }
    }
    let opts = GatewayOptions {
        audit: args.audit.clone(),
        audit_fail_open: args.audit_fail_open,
        ..GatewayOptions::default()
    };
    let mut loaded = cordon_policy::load(&args.manifest.path).map_err(|e| anyhow!("{e}"))?;
    let credentials = crate::credentials::credentials_for(
        loaded.policy.tools.values(),
        args.providers.as_deref(),
    )?;
    let mut registry =
        Registry::for_host(Default::default()).with_upstream_dns(crate::run::upstream_dns());
    if let Some(cb) = &credentials {
        registry = registry.with_credentials(cb.clone());
    }
    let running = loaded.policy.clone();
    let mut verdicts = Vec::new();
    if args.no_probe {
        eprintln!(
            "cordon: warning: --no-probe: tools are served without checking that their sandboxes hold here"
        );
    } else {
        for refusal in probe_and_filter(&mut loaded.policy, &registry, args.reprove, &mut verdicts)
        {
            eprintln!("cordon: {refusal}");
        }
    }
    prepare_tools(&loaded.policy, &registry);
    let bopts = cordon_broker::BrokerOptions {
        audit: opts.audit.clone(),
        audit_fail_open: opts.audit_fail_open,
        credentials: credentials.clone(),
        ..Default::default()
    };
    let broker = Arc::new(
        cordon_broker::Broker::with_registry(registry, &bopts).map_err(|e| anyhow!("{e}"))?,
    );
    let sandbox = Arc::new(cordon_mcp::servers_for(&broker, &opts));
    let prover = broker.clone();
    // The pools' state, for `cordon doctor` (removed when serving ends).
    let _pool_status = match crate::state::state_dir() {
        Ok(d) => cordon_runtime::pool_status::publish(&cordon_runtime::pool_status::dir_in(&d))
            .map_err(|e| eprintln!("cordon: the pool status for `cordon doctor` is off: {e}"))
            .ok(),
        Err(e) => {
            eprintln!("cordon: the pool status for `cordon doctor` is off: {e:#}");
            None
        }
    };
    let gw = Gateway::new(&loaded.policy, broker, sandbox)
        .map_err(|e| anyhow!("{e}"))?
        .with_listing_cache(match cordon_mcp::default_listing_dir() {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("cordon: the MCP listing cache is off: {e}");
                None
            }
        });
    let mut gw = gw;
    if args.no_metrics {
        gw = gw.without_metrics();
        eprintln!("cordon: metrics and console: off (--no-metrics)");
    }
    // Spans are exported by a blocking client on the SDK's own thread:
    // made here, before the gateway's async runtime.
    let traces = match (&args.otlp, cordon_mcp::traces::endpoint_in_env()) {
        (None, None) => None,
        (base, _) => Some(Arc::new(
            cordon_mcp::traces::Traces::export(base.as_deref()).map_err(|e| anyhow!(e))?,
        )),
    };
    if let Some(t) = &traces {
        eprintln!("cordon: traces: exported to {}", t.endpoint());
        gw = gw.with_traces(t.clone());
    }
    for w in gw.warnings() {
        eprintln!("cordon: warning: {w}");
    }
    for (tool, verdict, proved_at) in &verdicts {
        gw.metrics().probed(tool, verdict, *proved_at);
    }
    // Continuous conformance and SIGHUP's reload, on one thread.
    let r = &loaded.policy.gateway.reprobe;
    let every_override = args.reprobe_every.map(std::time::Duration::from_secs);
    let schedule = (!args.no_probe).then(|| crate::reprobe::Schedule {
        every: every_override.unwrap_or(std::time::Duration::from_secs(r.every_seconds)),
        jitter_percent: r.jitter_percent,
    });
    crate::reprobe::start(
        loaded.policy.tools.values().cloned().collect(),
        prover,
        gw.service().clone(),
        schedule,
        crate::reprobe::Reload {
            path: args.manifest.path.clone(),
            running,
            reloader: gw.reloader(),
            accept_weakening: args.accept_weakening,
            no_probe: args.no_probe,
            every_override,
            reports: report_keeper(args)?,
        },
    )?;
    let transport = match args.http {
        Some(addr) => {
            let mut hosts = args.allow_host.clone();
            match &authenticator {
                Some(a) => {
                    // Clients reach the resource by its URL's host.
                    hosts.extend(url_host(a.validator().resource()));
                    eprintln!("cordon: authentication: {}", a.validator().describe());
                }
                None => eprintln!(
                    "cordon: authentication: none (every HTTP caller is the unauthenticated principal)"
                ),
            }
            if tls.is_some() {
                eprintln!("cordon: TLS: on");
            }
            Transport::Http {
                addr,
                opts: HttpOptions {
                    extra_allowed_hosts: hosts,
                    authenticator: authenticator
                        .clone()
                        .map(|a| a as Arc<dyn cordon_mcp::http::Authenticator>),
                    tls: tls.clone(),
                    idle_timeout: args.idle_timeout.map(std::time::Duration::from_secs),
                    limits: conn_limits(args),
                },
            }
        }
        None => Transport::Stdio,
    };
    let tools = gw.tool_names().join(", ");
    let served = cordon_mcp::run(gw, transport, args.metrics, |ready| {
        if ready.starts_with("serving MCP") {
            eprintln!("cordon: {ready} (tools: {tools})");
        } else {
            eprintln!("cordon: {ready}");
        }
    });
    // The client went away, or SIGINT/SIGTERM: every session's tokens are
    // revoked before the process exits (the sessions' own ends revoke
    // theirs; this catches any still live).
    if let Some(cb) = &credentials
        && let Err(e) = cb.revoke_all("cordon serve is shutting down")
    {
        eprintln!("cordon: warning: {e}");
    }
    // The spans still waiting are sent before the process exits.
    if let Some(t) = &traces {
        t.shutdown(std::time::Duration::from_secs(5));
    }
    served.map_err(|e| anyhow!("{e}"))?;
    Ok(ExitCode::SUCCESS)
}

/// Where `serve` keeps the signed report of each probe run: `--reports`
/// (its key must exist), else the state directory's `reports` when the
/// key exists; `None` (said) when there is no key.
fn report_keeper(args: &ServeArgs) -> anyhow::Result<Option<crate::report::Keeper>> {
    if args.no_probe {
        return Ok(None);
    }
    let key = crate::key::key_path(args.report_key.as_deref());
    let key = match (&args.reports, key) {
        (Some(_), _) => crate::report::signing_key(args.report_key.as_deref())?,
        (None, Ok(k)) if k.exists() => crate::key::SigningKey::load(&k)?,
        (None, Ok(k)) => {
            eprintln!(
                "cordon: probe runs keep no signed report: no signing key at {} (`cordon key init` makes one)",
                k.display()
            );
            return Ok(None);
        }
        (None, Err(e)) => {
            eprintln!("cordon: probe runs keep no signed report: {e:#}");
            return Ok(None);
        }
    };
    let dir = match &args.reports {
        Some(d) => d.clone(),
        None => crate::state::state_dir()?.join("reports"),
    };
    let keeper = crate::report::Keeper::new(dir, key)?;
    eprintln!(
        "cordon: probe runs: a signed report of each kept in {}",
        keeper.dir().display()
    );
    Ok(Some(keeper))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_loopback_address_needs_authentication_and_tls() {
        let lo: SocketAddr = "127.0.0.2:8765".parse().unwrap();
        let lo6: SocketAddr = "[::1]:8765".parse().unwrap();
        let out: SocketAddr = "0.0.0.0:8765".parse().unwrap();
        let lan: SocketAddr = "192.0.2.7:8765".parse().unwrap();
        // Loopback: served as it is.
        assert_eq!(exposure(lo, false, false, false), Ok(None));
        assert_eq!(exposure(lo6, false, false, false), Ok(None));
        // Not loopback: both are needed, and the refusal says which lack.
        assert_eq!(exposure(lan, true, true, false), Ok(None));
        let e = exposure(out, false, false, false).unwrap_err();
        assert!(
            e.contains("without authentication (--auth FILE) and TLS"),
            "{e}"
        );
        let e = exposure(lan, true, false, false).unwrap_err();
        assert!(
            e.contains("without TLS") && !e.contains("authentication"),
            "{e}"
        );
        let e = exposure(lan, false, true, false).unwrap_err();
        assert!(
            e.contains("without authentication") && !e.contains("TLS"),
            "{e}"
        );
        // Explicitly accepted: served, with a warning saying what lacks.
        let w = exposure(lan, false, true, true).unwrap().unwrap();
        assert!(
            w.contains("--insecure-accept-plaintext") && w.contains("authentication"),
            "{w}"
        );
    }

    #[test]
    fn url_hosts() {
        assert_eq!(
            url_host("https://m.example:8443/mcp").as_deref(),
            Some("m.example")
        );
        assert_eq!(url_host("https://[::1]/mcp").as_deref(), Some("::1"));
        assert_eq!(
            url_host("https://u@m.example").as_deref(),
            Some("m.example")
        );
    }
}
