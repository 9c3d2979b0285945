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

pub fn run(path: &Path, host: bool) -> anyhow::Result<ExitCode> {
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
    for w in &loaded.warnings {
        eprintln!("warning: {w}");
    }
    let mut refused = 0;
    if host {
        let registry = cordon_runtime::Registry::for_host(Default::default());
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
        loaded.warnings.len(),
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

pub fn summary_line(t: &ToolPolicy) -> String {
    let limits = match t.limits {
        Some(l) => format!(
            "wall={}s mem={} tasks={} cpu={}% out={}",
            l.wall_seconds,
            format_size(l.memory_bytes),
            l.tasks,
            l.cpu_percent,
            format_size(l.output_bytes)
        ),
        None => "limits=none".into(),
    };
    format!(
        "{:<16} {:?} {:<8} {} {}",
        t.name,
        t.profile,
        format!("{:?}", t.runtime).to_lowercase(),
        network_summary(&t.network),
        limits
    )
}
