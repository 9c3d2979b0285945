//! `cordon check`: validate a manifest, summarise each tool, and admit each
//! on this host exactly as `run` and `serve` would: a tool that would not
//! start here (a required mechanism missing, a program, interpreter or
//! mount source that does not exist, a runtime this build lacks) is
//! reported with why, and makes the check fail.

use std::path::Path;
use std::process::ExitCode;

use cordon_policy::policy::{Network, ToolPolicy};
use cordon_policy::units::format_size;

use crate::{exit, shims};

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
            Ok(None) if host => None,
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
    // Warnings of admission (a mechanism accepted as partial), counted
    // with the manifest's own.
    let mut host_warnings = 0;
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
            // Without a provider file, serve refuses every tool that
            // declares secrets: said at each secret's line, with the
            // stanza that would let it start.
            if !t.secrets.is_empty() && credentials.is_none() {
                refused += 1;
                for d in no_provider_file(&loaded, t) {
                    eprintln!("{d}");
                }
                continue;
            }
            let mut diags = shims::refusals(&loaded, t);
            match registry.admit_each(t, cordon_runtime::Use::of(t)) {
                Ok(a) => {
                    for w in &a.warnings {
                        host_warnings += 1;
                        eprintln!("warning: {}: {w}", t.name);
                    }
                }
                Err(r) => diags.extend(admission(&loaded, t, &r)),
            }
            if !diags.is_empty() {
                refused += 1;
                for d in diags {
                    eprintln!("{d}");
                }
            }
        }
    }
    println!(
        "{}: {} valid, {}{}",
        path.display(),
        count(loaded.policy.tools.len(), "tool"),
        count(
            loaded.warnings.len() + secret_warnings + host_warnings,
            "warning"
        ),
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

/// Where `t` is declared in `loaded`'s file.
fn tool_line(loaded: &cordon_policy::Loaded, t: &ToolPolicy) -> (u64, u64) {
    loaded.tool_at.get(&t.name).copied().unwrap_or((1, 1))
}

/// A diagnostic about `t` at `at` in `loaded`'s file.
pub(crate) fn diag(
    loaded: &cordon_policy::Loaded,
    t: &ToolPolicy,
    at: (u64, u64),
    message: String,
    hint: Option<String>,
) -> cordon_policy::Diagnostic {
    cordon_policy::Diagnostic {
        file: loaded.path.clone(),
        line: at.0,
        column: at.1,
        tool: Some(t.name.clone()),
        message,
        hint,
    }
}

/// `t` declares secrets and no provider file is configured: one
/// diagnostic per secret, at its line, with a provider stanza to write.
fn no_provider_file(
    loaded: &cordon_policy::Loaded,
    t: &ToolPolicy,
) -> Vec<cordon_policy::Diagnostic> {
    t.secrets
        .iter()
        .map(|s| {
            let at = loaded
                .secret_at
                .get(&(t.name.clone(), s.name.clone()))
                .copied()
                .unwrap_or_else(|| tool_line(loaded, t));
            let (provider, default) = match &s.provider {
                Some(p) => (p.clone(), String::new()),
                None => ("mint".to_string(), "default: mint\n    ".to_string()),
            };
            diag(
                loaded,
                t,
                at,
                format!(
                    "would not start here: secret `{}` needs a credential broker, and there is no provider file ({}, --providers FILE or $CORDON_PROVIDERS); `cordon serve` and `run` refuse this tool",
                    s.name,
                    cordon_secrets::config::DEFAULT_PATH
                ),
                Some(format!(
                    "write a provider file (mode 0600, docs/secrets.md) at {} or give it with --providers FILE / $CORDON_PROVIDERS, defining the provider `{provider}`{}, e.g.:\n    {default}providers:\n      {provider}:\n        type: exec\n        command: [\"/usr/local/bin/mint-token\", \"--scope\", {}]",
                    cordon_secrets::config::DEFAULT_PATH,
                    if s.provider.is_none() {
                        " as its `default` (the secret names no provider)"
                    } else {
                        ""
                    },
                    crate::import::emit::q(&s.scope),
                )),
            )
        })
        .collect()
}

/// Each reason admission gave for refusing `t`, at the line it concerns
/// (a mount's source: that mount; anything else: the tool), with what to
/// do where cordon can say.
fn admission(
    loaded: &cordon_policy::Loaded,
    t: &ToolPolicy,
    r: &cordon_runtime::Refusal,
) -> Vec<cordon_policy::Diagnostic> {
    r.reasons()
        .into_iter()
        .map(|why| {
            let mount = why
                .bind_source
                .as_deref()
                .and_then(|src| t.mounts.iter().find(|m| Path::new(&m.src) == src));
            let at = mount
                .and_then(|m| loaded.mount_at.get(&(t.name.clone(), m.src.clone())))
                .copied()
                .unwrap_or_else(|| tool_line(loaded, t));
            let hint = hint_for(&why, mount);
            diag(loaded, t, at, format!("would not start here: {why}"), hint)
        })
        .collect()
}

/// What to write instead, for a reason admission gave.
fn hint_for(why: &str, mount: Option<&cordon_policy::policy::Mount>) -> Option<String> {
    if let Some(m) = mount {
        return Some(if why.contains("does not exist on the host") {
            format!(
                "create {} on this host, or change this mount's source to a path that exists (or remove the mount)",
                m.src
            )
        } else if why.contains("cannot be reached by the sandbox's uid") {
            format!(
                "make the directories above {} searchable by that uid, move it somewhere it can reach, or run cordon as root (a root broker mounts a clone of the tree)",
                m.src
            )
        } else if why.contains("binds host paths read-only only") {
            "make this mount read-only (drop `:rw`), or run the tool with `runtime: native`".into()
        } else if why.contains("shares no host directory") {
            "remove this mount: put what the tool needs in its image".into()
        } else {
            format!("fix this mount's source, {}, or remove the mount", m.src)
        });
    }
    if why.starts_with("bind source ") {
        return Some(
            "a path cordon binds for the tool (its image, package or volume) is missing: reinstall it (`cordon add`, `cordon import`) or fix the path".into(),
        );
    }
    let program = why.starts_with("program ");
    let interpreter = why.contains("interpreter ") || why.contains("dynamic loader ");
    if program && why.contains("is not found in PATH") {
        return Some(
            "the program is missing inside the sandbox: write its absolute path in `command`, and mount its directory under `mounts:` when it is not in /usr, /bin or /lib".into(),
        );
    }
    if interpreter {
        return Some(
            "the program's interpreter is missing inside the sandbox: write the real interpreter (not a version manager's shim or a symlink into a home) in `command`, or mount the directory it is in under `mounts:`".into(),
        );
    }
    if program && (why.contains("symlink") || why.contains("does not exist")) {
        return Some(
            "the program is missing inside the sandbox: install it, or write a path that exists in `command` and mount its directory under `mounts:` when it is not in /usr, /bin or /lib".into(),
        );
    }
    None
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

/// `n` and `what`, plural unless `n` is 1.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}
