//! `cordon check`: validate a manifest and summarise each tool.

use std::path::Path;
use std::process::ExitCode;

use cordon_policy::policy::{Network, ToolPolicy};
use cordon_policy::units::format_size;

use crate::exit;

pub fn run(path: &Path) -> anyhow::Result<ExitCode> {
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
    println!(
        "{}: {} tools valid, {} warnings",
        path.display(),
        loaded.policy.tools.len(),
        loaded.warnings.len()
    );
    Ok(ExitCode::from(exit::OK))
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
