//! `cordon probe`: run the conformance catalogue inside each tool's own
//! sandbox (or another sandbox's command prefix) and report HELD, ESCAPED
//! or SKIPPED per probe. Exit 1 if anything escaped or a control failed.

use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow};

use cordon_jail::Jail;
use cordon_policy::policy::{Exec, Profile as PolicyProfile, Runtime, ToolPolicy};
use cordon_probes::{Filter, Format, JailSandbox, NoSandbox, PrefixSandbox, Report, Targets};

use crate::exit;

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// The manifest whose tools are probed (each in exactly its own sandbox).
    #[arg(short = 'm', long = "manifest", env = "CORDON_MANIFEST")]
    pub manifest: Option<PathBuf>,
    /// Only this tool.
    #[arg(long)]
    pub tool: Option<String>,
    /// Probe a profile with its defaults instead of a manifest's tools (P0 or P1).
    #[arg(long)]
    pub profile: Option<String>,
    /// Only these probes or categories (escape, resource). Repeatable.
    #[arg(long = "only")]
    pub only: Vec<String>,
    /// Skip these probes or categories. Repeatable.
    #[arg(long = "skip")]
    pub skip: Vec<String>,
    /// The full report as JSON.
    #[arg(long, conflicts_with = "junit")]
    pub json: bool,
    /// Also write a JUnit XML report to FILE.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Target of the outside-network probe (default 1.1.1.1:443).
    #[arg(long, value_name = "ADDR")]
    pub target_outside: Option<SocketAddr>,
    /// Target of the metadata probe (default 169.254.169.254:80).
    #[arg(long, value_name = "ADDR")]
    pub target_metadata: Option<SocketAddrV4>,
    /// Target of the private-range probe (default 10.0.0.1:80).
    #[arg(long, value_name = "ADDR")]
    pub target_private: Option<SocketAddr>,
    /// Resolver of the DNS probe (default 1.1.1.1:53).
    #[arg(long, value_name = "ADDR")]
    pub target_dns: Option<SocketAddr>,
    /// Run the catalogue through another sandbox's command prefix, given
    /// after `--` (bwrap, nsjail, docker run, ...). `{agent}` and
    /// `{agent_dir}` in it name the probe agent; without them the agent's
    /// path is appended.
    #[arg(long, requires = "cmd")]
    pub prefix: bool,
    /// The prefix command (with --prefix).
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

fn targets(a: &ProbeArgs) -> Targets {
    let mut t = Targets::default();
    if let Some(x) = a.target_outside {
        t.outside = x;
    }
    if let Some(x) = a.target_metadata {
        t.metadata = x;
    }
    if let Some(x) = a.target_private {
        t.private = x;
    }
    if let Some(x) = a.target_dns {
        t.dns = x;
    }
    t
}

/// Why a tool's sandbox cannot be probed here; such tools are reported
/// SKIPPED with this reason, never as held.
fn unprobeable(p: &ToolPolicy) -> Option<String> {
    if p.runtime != Runtime::Native {
        return Some(format!(
            "runtime {:?} is not available in this build",
            p.runtime
        ));
    }
    match &p.exec {
        Exec::Command { .. } => None,
        Exec::Mcp {
            command: Some(_), ..
        } => None,
        Exec::Mcp { .. } | Exec::Image { .. } => {
            Some("an `image` needs an OCI runtime, which this build does not have".into())
        }
        Exec::Unspecified => Some("the manifest gives nothing to run".into()),
    }
}

/// The sandbox a tool runs in. An `mcp:` server runs in the same jail a
/// command tool of its policy would (`cordon serve` adds only a stdio
/// prologue), so its sandbox is probed as that command's.
fn probe_spec(
    p: &ToolPolicy,
) -> anyhow::Result<(cordon_jail::JailSpec, Option<cordon_egress::EgressPolicy>)> {
    let spec = match &p.exec {
        Exec::Mcp {
            command: Some(argv),
            ..
        } => {
            let mut q = p.clone();
            q.exec = Exec::Command { argv: argv.clone() };
            cordon_broker::jail_spec(&q)
        }
        _ => cordon_broker::jail_spec(p),
    };
    spec.map_err(|e| anyhow!("{e}"))
}

/// A tool's own sandbox, egress doors included: the agent runs through
/// the broker exactly as the tool would.
struct ToolSandbox {
    broker: Arc<cordon_broker::Broker>,
    base: cordon_jail::JailSpec,
    egress: Option<cordon_egress::EgressPolicy>,
}

impl cordon_probes::Sandbox for ToolSandbox {
    fn name(&self) -> String {
        format!(
            "cordon jail ({}, seccomp {:?}, network {})",
            if self.broker.uses_cgroups() {
                "cgroups"
            } else {
                "rlimits"
            },
            self.base.seccomp,
            if self.egress.is_some() {
                "egress doors"
            } else {
                "none"
            }
        )
    }

    fn run(
        &self,
        req: &cordon_probes::ProbeRun,
    ) -> Result<cordon_probes::RunResult, cordon_probes::SandboxError> {
        let agent = cordon_probes::jail::AGENT_IN_JAIL;
        let mut spec = self.base.clone();
        spec.argv = std::iter::once(agent.to_string())
            .chain(req.args.iter().cloned())
            .collect();
        spec.binds.push(cordon_jail::Bind {
            src: req.agent.clone(),
            dst: agent.into(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let broker = self.broker.clone();
        let egress = self.egress.clone();
        let stdin = req.stdin.clone();
        std::thread::spawn(move || {
            let _ = tx.send(broker.run_spec(&spec, egress, stdin));
        });
        match rx.recv_timeout(req.timeout) {
            Ok(Ok((o, _events))) => Ok(cordon_probes::jail::run_result(&o)),
            Ok(Err(e)) => Err(cordon_probes::SandboxError::Backend(e.to_string())),
            Err(_) => Err(cordon_probes::SandboxError::Backend(format!(
                "the jail did not return within {:.1} s",
                req.timeout.as_secs_f64()
            ))),
        }
    }
}

/// The limits a tool's sandbox claims, as the probes judge them.
fn tool_profile(
    p: &ToolPolicy,
    spec: &cordon_jail::JailSpec,
    jail: &Arc<Jail>,
) -> cordon_probes::Profile {
    JailSandbox::new(jail.clone(), spec.clone()).profile(&format!(
        "{} ({})",
        p.name,
        cordon_broker::profile_name(p.profile)
    ))
}

/// Probe one tool's own sandbox with the default targets (fail-closed
/// checks of `run --probe-first` and `serve`). `Err` names every probe that
/// did not hold.
pub fn probe_tool(p: &ToolPolicy, jail: Arc<Jail>) -> anyhow::Result<Report> {
    let agent = std::env::current_exe().context("locating cordon itself (the probe agent)")?;
    if let Some(why) = unprobeable(p) {
        return Err(anyhow!("{}: cannot be probed here: {why}", p.name));
    }
    let (spec, egress) = probe_spec(p)?;
    let prof = tool_profile(p, &spec, &jail);
    let (t, f) = (Targets::default(), Filter::default());
    let report = if egress.is_some() {
        let broker =
            Arc::new(cordon_broker::Broker::new(Some("-".into())).map_err(|e| anyhow!("{e}"))?);
        let sb = ToolSandbox {
            broker,
            base: spec,
            egress,
        };
        cordon_probes::run_suite(&sb, &agent, &prof, &t, &f)
    } else {
        let sb = JailSandbox::new(jail, spec);
        cordon_probes::run_suite(&sb, &agent, &prof, &t, &f)
    };
    let failed: Vec<String> = report
        .results
        .iter()
        .filter(|r| {
            !matches!(
                r.verdict,
                cordon_probes::Verdict::Held | cordon_probes::Verdict::Skipped
            )
        })
        .map(|r| format!("{} {:?}: {}", r.probe, r.verdict, r.evidence))
        .collect();
    if !failed.is_empty() {
        return Err(anyhow!(
            "{}: refusing to start: {} probe(s) of its sandbox do not hold on this host: {}",
            p.name,
            failed.len(),
            failed.join("; ")
        ));
    }
    Ok(report)
}

pub fn run(a: ProbeArgs) -> anyhow::Result<ExitCode> {
    let agent = std::env::current_exe().context("locating cordon itself (the probe agent)")?;
    let filter = Filter {
        only: a.only.clone(),
        skip: a.skip.clone(),
    };
    let unknown = filter.unknown_names();
    if !unknown.is_empty() {
        return Err(anyhow!("unknown probe or category: {}", unknown.join(", ")));
    }
    let targets = targets(&a);
    let mut reports: Vec<Report> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();

    if !a.cmd.is_empty() && !a.prefix {
        return Err(anyhow!("a command after `--` needs --prefix"));
    }
    if a.prefix {
        let prefix = &a.cmd;
        let sb = PrefixSandbox::new(prefix.clone()).map_err(|e| anyhow!("{e}"))?;
        let prof = cordon_probes::Profile::unclaimed(format!("prefix: {}", prefix.join(" ")));
        reports.push(cordon_probes::run_suite(
            &sb, &agent, &prof, &targets, &filter,
        ));
    } else if let Some(profile) = &a.profile {
        match profile.as_str() {
            "P0" => {
                let prof = cordon_probes::Profile::unclaimed("P0");
                reports.push(cordon_probes::run_suite(
                    &NoSandbox, &agent, &prof, &targets, &filter,
                ));
            }
            "P1" => {
                let sb = JailSandbox::with_defaults().map_err(|e| anyhow!("{e}"))?;
                let prof = sb.profile("P1");
                reports.push(cordon_probes::run_suite(
                    &sb, &agent, &prof, &targets, &filter,
                ));
            }
            other => {
                return Err(anyhow!(
                    "--profile {other}: P0 and P1 can be probed with their defaults; P2 and P3 need a manifest tool"
                ));
            }
        }
    } else {
        let path = a
            .manifest
            .clone()
            .unwrap_or_else(|| PathBuf::from("cordon.yaml"));
        let loaded = cordon_policy::load(&path).map_err(|e| anyhow!("{e}"))?;
        let jail = Arc::new(Jail::new().map_err(|e| anyhow!("{e}"))?);
        let tools: Vec<&ToolPolicy> = match &a.tool {
            Some(t) => vec![
                loaded
                    .policy
                    .get(t)
                    .ok_or_else(|| anyhow!("no tool `{t}` in {}", path.display()))?,
            ],
            None => loaded.policy.tools.values().collect(),
        };
        let mut egress_broker: Option<Arc<cordon_broker::Broker>> = None;
        for p in tools {
            if p.profile == PolicyProfile::P0 {
                let prof = cordon_probes::Profile::unclaimed(format!("{} (P0)", p.name));
                reports.push(cordon_probes::run_suite(
                    &NoSandbox, &agent, &prof, &targets, &filter,
                ));
                continue;
            }
            if let Some(why) = unprobeable(p) {
                skipped.push((p.name.clone(), why));
                continue;
            }
            let (spec, egress) = probe_spec(p)?;
            let prof = tool_profile(p, &spec, &jail);
            if egress.is_some() {
                let broker = match &egress_broker {
                    Some(b) => Arc::clone(b),
                    None => {
                        let b = Arc::new(
                            cordon_broker::Broker::new(Some("-".into()))
                                .map_err(|e| anyhow!("{e}"))?,
                        );
                        egress_broker = Some(b.clone());
                        b
                    }
                };
                let sb = ToolSandbox {
                    broker,
                    base: spec,
                    egress,
                };
                reports.push(cordon_probes::run_suite(
                    &sb, &agent, &prof, &targets, &filter,
                ));
            } else {
                let sb = JailSandbox::new(jail.clone(), spec);
                reports.push(cordon_probes::run_suite(
                    &sb, &agent, &prof, &targets, &filter,
                ));
            }
        }
    }

    let mut worst = 0;
    if a.json {
        let v: Vec<serde_json::Value> = reports
            .iter()
            .map(|r| serde_json::from_str(&r.render(Format::Json)).unwrap_or_default())
            .collect();
        let skipped_json: Vec<serde_json::Value> = skipped
            .iter()
            .map(|(t, why)| serde_json::json!({"tool": t, "skipped": why}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"reports": v, "skipped_tools": skipped_json})
            )?
        );
    } else {
        for r in &reports {
            print!("{}", r.render(Format::Human));
            println!();
        }
        for (t, why) in &skipped {
            println!("SKIPPED tool {t}: {why}");
        }
    }
    if let Some(path) = &a.junit {
        let xml: String = reports
            .iter()
            .map(|r| r.render(Format::Junit))
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(path, xml).with_context(|| format!("writing {}", path.display()))?;
    }
    for r in &reports {
        worst = worst.max(r.exit_code());
    }
    if reports.is_empty() {
        eprintln!("cordon probe: nothing was probed");
        return Ok(ExitCode::from(exit::USAGE));
    }
    Ok(ExitCode::from(u8::try_from(worst).unwrap_or(exit::FINDING)))
}
