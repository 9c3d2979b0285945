//! `cordon check`: validate a manifest, summarise each tool, and admit each
//! on this host exactly as `run` and `serve` would: a tool that would not
//! start here (a required mechanism missing, a program, interpreter or
//! mount source that does not exist, a runtime this build lacks) is
//! reported with why, and makes the check fail.

use std::path::Path;
use std::process::ExitCode;

use cordon_policy::policy::{Network, ToolPolicy};
use cordon_policy::units::format_size;

use crate::exit;

pub fn run(path: &Path, host: bool, providers: Option<&Path>) -> anyhow::Result<ExitCode> {
    let loaded = match cordon_policy::load(path) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("{e}");
            eprintln!("{}: invalid", path.display());
            return Ok(ExitCode::from(exit::FINDING));
        }
    };
    for t in loaded.policy.tools.values() {
        println!("{}", summary_line(t));
    }
    match &loaded.policy.access {
        Some(a) => println!(
            "access: {} grants; a caller uses only what one gives it",
            a.grants.len()
        ),
        None => println!("access: no grants; every caller may use every tool"),
    }
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    // Secrets: every provider named must be in the provider file, and a
    // static provider is flagged as weak.
    let with_secrets = loaded.policy.tools.values().any(|t| !t.secrets.is_empty());
    let credentials = if with_secrets {
        match cordon_secrets::CredentialBroker::discover(providers) {
            Ok(Some(cb)) => Some(std::sync::Arc::new(cb)),
            Ok(None) => {
                eprintln!(
                    "warning: no provider file ({} or --providers/$CORDON_PROVIDERS): tools that declare secrets would be refused",
                    cordon_secrets::config::DEFAULT_PATH
                );
                None
            }
            Err(e) => {
                eprintln!("{e}");
                eprintln!("{}: the provider file is invalid", path.display());
                return Ok(ExitCode::from(exit::FINDING));
            }
        }
    } else {
        None
    };
    let mut secret_errors = 0;
    let mut secret_warnings = 0;
    if let Some(cb) = &credentials {
        for t in loaded.policy.tools.values() {
            for s in &t.secrets {
                let (line, column) = loaded
                    .secret_at
                    .get(&(t.name.clone(), s.name.clone()))
                    .copied()
                    .unwrap_or((1, 1));
                let diag = |message: String, hint: Option<String>| cordon_policy::Diagnostic {
                    file: path.to_path_buf(),
                    line,
                    column,
                    tool: Some(t.name.clone()),
                    message,
                    hint,
                };
                match cb.provider_of(s) {
                    Err(m) => {
                        secret_errors += 1;
                        eprintln!(
                            "{}",
                            diag(
                                m,
                                Some("define it in the provider file, or name one it has".into())
                            )
                        );
                    }
                    Ok((name, cordon_secrets::Kind::Static)) => {
                        secret_warnings += 1;
                        eprintln!(
                            "warning: {}",
                            diag(
                                format!(
                                    "secret `{}` comes from the static provider `{name}`: one long-lived value, neither scoped nor minted per session",
                                    s.name
                                ),
                                Some("for development only; use an exec or oauth2 provider".into()),
                            )
                        );
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    if secret_errors > 0 {
        eprintln!("{}: invalid", path.display());
        return Ok(ExitCode::from(exit::FINDING));
    }
    let mut refused = 0;
    if host {
        let mut registry = cordon_runtime::Registry::for_host(Default::default())
            .with_upstream_dns(crate::run::upstream_dns());
        if let Some(cb) = &credentials {
            registry = registry.with_credentials(cb.clone());
        }
        for t in loaded.policy.tools.values() {
            if t.profile == cordon_policy::policy::Profile::P0 {
                continue;
            }
            match registry.admit(t, cordon_runtime::Use::of(t)) {
                Ok(a) => {
                    for w in &a.warnings {
                        eprintln!("warning: {}: {w}", t.name);
                    }
                }
                Err(why) => {
                    refused += 1;
                    eprintln!("would not start here: {why}");
                }
            }
        }
    }
    println!(
        "{}: {} tools valid, {} warnings{}",
        path.display(),
        loaded.policy.tools.len(),
        loaded.warnings.len() + secret_warnings,
        if !host {
            " (host not checked)".to_string()
        } else if refused > 0 {
            format!(", {refused} would not start on this host")
        } else {
            ", every tool would start on this host".to_string()
        }
    );
    Ok(ExitCode::from(if refused > 0 {
        exit::FINDING
    } else {
        exit::OK
    }))
}

pub fn network_summary(n: &Network) -> String {
    match n {
        Network::None => "network=none".into(),
        Network::Allowlist { allow, .. } => format!("egress={}", allow.join(",")),
        Network::Proxy { .. } => "egress=proxy(80,443 public)".into(),
        Network::Host => "network=HOST(unfiltered)".into(),
    }
}

/// The secrets of a tool for its summary line: name, delivery and where.
fn secrets_summary(t: &ToolPolicy) -> String {
    if t.secrets.is_empty() {
        return String::new();
    }
    let each: Vec<String> = t
        .secrets
        .iter()
        .map(|s| match (&s.deliver, &s.bind) {
            (cordon_policy::policy::Deliver::Env, _) => format!("{}(ENV)", s.name),
            (_, Some(b)) => format!("{}(proxy {}:{})", s.name, b.host, b.port),
            (_, None) => format!("{}(proxy)", s.name),
        })
        .collect();
    format!(" secrets={}", each.join(","))
}

pub fn summary_line(t: &ToolPolicy) -> String {
    let limits = match t.limits {
        Some(l) => format!(
            "wall={}s mem={} tasks={} cpu={} out={}",
            l.wall.as_secs(),
            format_size(l.memory_bytes),
            l.tasks,
            l.cpu_percent
                .map_or_else(|| "none".into(), |c| format!("{c}%")),
            format_size(l.output_bytes)
        ),
        None => "limits=none".into(),
    };
    format!(
        "{:<16} {:?} {:<8} {} {}{}",
        t.name,
        t.profile,
        format!("{:?}", t.runtime).to_lowercase(),
        network_summary(&t.network),
        limits,
        secrets_summary(t)
    )
}
