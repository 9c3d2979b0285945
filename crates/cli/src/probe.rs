//! `cordon probe`: run the conformance catalogue inside each tool's own
//! sandbox (or another sandbox's command prefix) and report HELD, ESCAPED
//! or SKIPPED per probe. Exit 1 if anything escaped or a control failed
//! (whatever else happened), 3 if nothing escaped but some probe or tool
//! could not be judged, 0 if everything held.

use std::net::{SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, anyhow};

use cordon_policy::policy::{Profile as PolicyProfile, ToolPolicy};
use cordon_probes::{
    Filter, Format, NoSandbox, PrefixSandbox, Report, RuntimeSandbox, Targets, WasmTarget,
    run_wasm_suite,
};
use cordon_runtime::{Registry, SandboxSpec, Use};

use crate::{exit, report, state};

/// Exit status of a probe run: nothing escaped, but a probe or a tool
/// could not be judged.
pub const INCONCLUSIVE: u8 = 3;

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
    /// Also write a signed report to FILE: doctor's host facts, cordon's
    /// version, start and end times, and per tool its policy hash and
    /// every probe's verdict and evidence, signed with the host key
    /// (`cordon key init`). Check it with `cordon report verify`.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// The private key that signs the report (default: report-key.pem in
    /// cordon's configuration directory, see `cordon key init`). Unused
    /// without --report.
    #[arg(long, value_name = "KEY", env = "CORDON_REPORT_KEY")]
    pub key: Option<PathBuf>,
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
    /// The credential broker's provider file, for tools that declare
    /// secrets (the probes mint nothing; admission needs the providers).
    #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
    pub providers: Option<PathBuf>,
    /// The probe module run in place of a wasm tool's module (default:
    /// $CORDON_WASM_PROBE, else cordon-probe.wasm beside cordon or in
    /// ../wasm; scripts/build-wasm-example.sh builds it).
    #[arg(long, value_name = "FILE")]
    pub wasm_probe: Option<PathBuf>,
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

/// The sandbox a tool runs in, admitted exactly as `run` and `serve`
/// admit it: the probe agent then runs as its program, through the same
/// runtime and egress doors. `Err`: it cannot be probed here (the same
/// refusal the tool would get). Its workspace and state are left out:
/// they belong to a session and a tenant, which a probe run has not, and
/// they are read-write binds the probes would only write into.
pub fn tool_sandbox(p: &ToolPolicy, registry: &Registry) -> Result<RuntimeSandbox, String> {
    if p.runtime == cordon_policy::policy::Runtime::Wasm {
        return Err(
            "a wasm tool runs only its WASI module, not the native probe agent: it is probed with the probe module instead"
                .into(),
        );
    }
    let mut p = p.clone();
    p.workspace = None;
    p.state = None;
    let admitted = registry.admit(&p, Use::of(&p))?;
    Ok(RuntimeSandbox::new(admitted.runtime, admitted.spec))
}

/// A wasm tool as a probe target, admitted exactly as `run` and `serve`
/// admit it (its own module must be the pinned one): the probe module
/// (`module`, else found by [`cordon_probes::wasm::find_module`]) then
/// runs in place of the tool's module, with its preopens, environment and
/// limits, through the same runtime. With the profile it claims.
pub fn wasm_target(
    p: &ToolPolicy,
    registry: &Registry,
    module: Option<&std::path::Path>,
) -> Result<(WasmTarget, cordon_probes::Profile), String> {
    let admitted = registry.admit(p, Use::of(p))?;
    let module = cordon_probes::wasm::find_module(module)?;
    let l = &admitted.spec.limits;
    let profile = cordon_probes::Profile {
        name: profile_label(p),
        limits: cordon_probes::Limits {
            memory_bytes: Some(l.memory_bytes),
            tasks: Some(l.tasks),
            wall: Some(l.wall),
            output_bytes: Some(l.output_bytes),
            disk_bytes: Some(l.disk_bytes),
            fds: Some(l.nofile),
        },
        egress_allow: Vec::new(),
        mounts: admitted.spec.mounts.iter().map(|m| m.dst.clone()).collect(),
    };
    Ok((
        WasmTarget::new(admitted.runtime, admitted.spec, module),
        profile,
    ))
}

/// Run the probes of one tool's own sandbox: the catalogue through the
/// probe agent, or, for a wasm tool, the probe module. `Err`: it cannot be
/// probed here, and why.
fn suite_of(
    p: &ToolPolicy,
    registry: &Registry,
    agent: &std::path::Path,
    targets: &Targets,
    filter: &Filter,
    wasm_probe: Option<&std::path::Path>,
) -> Result<Report, String> {
    if p.runtime == cordon_policy::policy::Runtime::Wasm {
        let (target, prof) = wasm_target(p, registry, wasm_probe)?;
        return Ok(run_wasm_suite(&target, &prof, filter));
    }
    let sb = tool_sandbox(p, registry)?;
    let prof = sb.profile(&profile_label(p));
    Ok(cordon_probes::run_suite(&sb, agent, &prof, targets, filter))
}

fn profile_label(p: &ToolPolicy) -> String {
    format!("{} ({})", p.name, cordon_broker::profile_name(p.profile))
}

/// The probes that did not hold, one line per cause: probes that failed
/// the same way (a sandbox that cannot start fails every probe alike) are
/// said once, with how many and which. The number of probes, and the lines.
fn not_held_once(report: &Report) -> (usize, Vec<String>) {
    let mut causes: Vec<((cordon_probes::Verdict, &str), Vec<&str>)> = Vec::new();
    let mut n = 0;
    for r in &report.results {
        if matches!(
            r.verdict,
            cordon_probes::Verdict::Held | cordon_probes::Verdict::Skipped
        ) {
            continue;
        }
        n += 1;
        let key = (r.verdict, r.evidence.as_str());
        match causes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, probes)) => probes.push(&r.probe),
            None => causes.push((key, vec![&r.probe])),
        }
    }
    let lines = causes
        .into_iter()
        .map(|((verdict, evidence), probes)| match probes.as_slice() {
            [one] => format!("{one} {verdict:?}: {evidence}"),
            many => format!(
                "{} probes {verdict:?} ({}): {evidence}",
                many.len(),
                many.join(", ")
            ),
        })
        .collect();
    (n, lines)
}

/// Run the default catalogue in one tool's own sandbox (the probe module
/// for a wasm tool).
fn run_tool_suite(p: &ToolPolicy, registry: &Registry) -> anyhow::Result<Report> {
    let agent = std::env::current_exe().context("locating cordon itself (the probe agent)")?;
    suite_of(
        p,
        registry,
        &agent,
        &Targets::default(),
        &Filter::default(),
        None,
    )
    .map_err(|why| {
        anyhow!(
            "{}: refusing to start: cannot be probed here: {why}",
            p.name
        )
    })
}

/// `Err` naming the tool and every probe of `report` that did not hold.
fn held_or_refused(p: &ToolPolicy, report: Report) -> anyhow::Result<Report> {
    let (n, failed) = not_held_once(&report);
    if n > 0 {
        return Err(anyhow!(
            "{}: refusing to start: {n} probe(s) of its sandbox do not hold on this host: {}",
            p.name,
            failed.join("; ")
        ));
    }
    Ok(report)
}

/// Probe one tool's own sandbox with the default targets (the fail-closed
/// check of `run --probe-first`). `Err` names the tool and every probe
/// that did not hold, or why it cannot be probed.
pub fn probe_tool(p: &ToolPolicy, registry: &Registry) -> anyhow::Result<Report> {
    held_or_refused(p, run_tool_suite(p, registry)?)
}

/// The wall clock of a start-up probe run (`serve`), in seconds: short, so
/// that start-up stays quick; the mechanism under test is the same.
pub const START_PROBE_WALL: u64 = 3;

/// The longest wall a start-up probe run is retried with (3, 6, 12, 24 s).
pub const MAX_PROBE_WALL: u64 = 24;

/// What one run of the catalogue says of a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    /// Every probe held (or was skipped) and the control passed.
    Held,
    /// A probe escaped, or failed otherwise than by running out of time:
    /// the sandbox does not hold (an escape wins over every timeout).
    Refused,
    /// Nothing escaped, and every probe that did not hold (the control
    /// included) was stopped by the wall clock or the harness's timeout
    /// before it gave an answer: no verdict either way.
    Inconclusive,
}

/// Whether a probe run ended for lack of time rather than with an answer.
fn ran_out_of_time(r: &cordon_probes::ProbeResult) -> bool {
    use cordon_probes::sandbox::{LimitKind, RunStatus};
    r.verdict == cordon_probes::Verdict::Error
        && matches!(
            r.status,
            Some(RunStatus::Limit(LimitKind::Wall) | RunStatus::HarnessTimeout)
        )
}

/// What `report` says: see [`Finding`].
pub fn finding(report: &Report) -> Finding {
    use cordon_probes::Verdict;
    let not_held: Vec<_> = report
        .results
        .iter()
        .filter(|r| !matches!(r.verdict, Verdict::Held | Verdict::Skipped))
        .collect();
    if not_held.is_empty() {
        return Finding::Held;
    }
    // Void: not run because the control failed; the control's own result
    // says why.
    let judged: Vec<_> = not_held
        .into_iter()
        .filter(|r| r.verdict != Verdict::Void)
        .collect();
    if !judged.is_empty() && judged.iter().all(|r| ran_out_of_time(r)) {
        Finding::Inconclusive
    } else {
        Finding::Refused
    }
}

/// After a run with a wall of `wall` seconds that found `f`: the wall to
/// run again with (an inconclusive run, doubled up to [`MAX_PROBE_WALL`]),
/// or `None` (a verdict, or no longer wall left to try).
pub fn retry_wall(f: Finding, wall: u64) -> Option<u64> {
    (f == Finding::Inconclusive && wall < MAX_PROBE_WALL)
        .then(|| wall.saturating_mul(2).clamp(1, MAX_PROBE_WALL))
}

/// Run `run` with a wall of `first` seconds, then again with a longer
/// wall for as long as it is inconclusive (see [`retry_wall`]). The last
/// report, what it found, and every wall tried.
pub fn with_retries<E>(
    first: u64,
    mut run: impl FnMut(u64) -> Result<Report, E>,
) -> Result<(Report, Finding, Vec<u64>), E> {
    let mut walls = vec![first];
    loop {
        let wall = walls[walls.len() - 1];
        let report = run(wall)?;
        let f = finding(&report);
        match retry_wall(f, wall) {
            Some(next) => walls.push(next),
            None => return Ok((report, f, walls)),
        }
    }
}

/// Probe one tool's own sandbox at `serve`'s start: with a wall clock of
/// [`START_PROBE_WALL`] (or the tool's own, if shorter), and, where every
/// probe that did not hold ran out of time (a loaded host), again with a
/// longer wall, up to [`MAX_PROBE_WALL`]. Never a pass for a sandbox that
/// leaks (an escape refuses at once), nor a refusal without saying why:
/// still out of time at the longest wall, the tool is refused, saying its
/// probes timed out.
pub fn probe_tool_at_start(p: &ToolPolicy, registry: &Registry) -> anyhow::Result<Report> {
    let Some(own) = p.limits.as_ref().map(|l| l.wall.as_secs()) else {
        return probe_tool(p, registry);
    };
    let (report, found, walls) = with_retries(own.min(START_PROBE_WALL), |wall| {
        let mut p = p.clone();
        if let Some(l) = p.limits.as_mut() {
            l.wall = std::time::Duration::from_secs(wall);
        }
        run_tool_suite(&p, registry)
    })?;
    if found == Finding::Inconclusive {
        let walls: Vec<String> = walls.iter().map(|w| format!("{w} s")).collect();
        let (_, failed) = not_held_once(&report);
        return Err(anyhow!(
            "{}: refusing to start: its probes timed out, inconclusive with a wall clock of {} (is the host overloaded?): {}",
            p.name,
            walls.join(", "),
            failed.join("; ")
        ));
    }
    held_or_refused(p, report)
}

/// Why a re-probe run of `serve` did not hold: the probes that did not
/// (or what stopped the run), and what it said.
#[derive(Debug, Clone)]
pub struct NotHeld {
    pub probes: Vec<String>,
    pub why: String,
}

/// Probe one served tool again (`serve`'s continuous conformance): as
/// [`probe_tool_at_start`] does, keeping the names of the probes that did
/// not hold. A run still out of time at the longest wall does not hold.
/// The run's report comes with the verdict (`None`: the run did not
/// happen).
pub fn reprobe_tool(p: &ToolPolicy, registry: &Registry) -> (Result<(), NotHeld>, Option<Report>) {
    match reprobe_report(p, registry) {
        Ok(report) => (judge(&report), Some(report)),
        Err(not) => (Err(not), None),
    }
}

fn reprobe_report(p: &ToolPolicy, registry: &Registry) -> Result<Report, NotHeld> {
    let setup = |e: anyhow::Error| NotHeld {
        probes: vec!["(set-up)".into()],
        why: format!("{e:#}"),
    };
    let report = match p.limits.as_ref().map(|l| l.wall.as_secs()) {
        None => run_tool_suite(p, registry).map_err(setup)?,
        Some(own) => {
            with_retries(own.min(START_PROBE_WALL), |wall| {
                let mut p = p.clone();
                if let Some(l) = p.limits.as_mut() {
                    l.wall = std::time::Duration::from_secs(wall);
                }
                run_tool_suite(&p, registry)
            })
            .map_err(setup)?
            .0
        }
    };
    Ok(report)
}

/// Whether `report` holds: `Err` naming every probe that did not.
fn judge(report: &Report) -> Result<(), NotHeld> {
    let (n, lines) = not_held_once(report);
    if n == 0 {
        return Ok(());
    }
    let probes = report
        .results
        .iter()
        .filter(|r| {
            !matches!(
                r.verdict,
                cordon_probes::Verdict::Held | cordon_probes::Verdict::Skipped
            )
        })
        .map(|r| r.probe.clone())
        .collect();
    Err(NotHeld {
        probes,
        why: lines.join("; "),
    })
}

/// The exit status of a whole run: an escape (or a failed control) wins
/// over everything; then anything that could not be judged.
pub fn combined_exit(reports: &[Report], unprobed: usize) -> u8 {
    if reports
        .iter()
        .any(|r| r.exit_code() == cordon_probes::report::EXIT_ESCAPED)
    {
        exit::FINDING
    } else if unprobed > 0
        || reports
            .iter()
            .any(|r| r.exit_code() != cordon_probes::report::EXIT_ALL_HELD)
    {
        INCONCLUSIVE
    } else {
        exit::OK
    }
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
    // A report is never written unsigned: no key, no run.
    let signer = match &a.report {
        Some(_) => Some(report::signing_key(a.key.as_deref())?),
        None => None,
    };
    let started = state::now_rfc3339();
    let host = signer
        .as_ref()
        .map(|_| crate::doctor::collect(a.providers.as_deref()).0);
    let mut reports: Vec<Report> = Vec::new();
    // What each of `reports` is of, in the same order.
    let mut subjects: Vec<report::Subject> = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();

    if !a.cmd.is_empty() && !a.prefix {
        return Err(anyhow!("a command after `--` needs --prefix"));
    }
    if a.prefix {
        let prefix = &a.cmd;
        let sb = PrefixSandbox::new(prefix.clone()).map_err(|e| anyhow!("{e}"))?;
        let prof = cordon_probes::Profile::unclaimed(format!("prefix: {}", prefix.join(" ")));
        subjects.push(report::Subject::bare(
            &format!("prefix: {}", prefix.join(" ")),
            "unclaimed",
            "none",
        ));
        reports.push(cordon_probes::run_suite(
            &sb, &agent, &prof, &targets, &filter,
        ));
    } else if let Some(profile) = &a.profile {
        match profile.as_str() {
            "P0" => {
                let prof = cordon_probes::Profile::unclaimed("P0");
                subjects.push(report::Subject::bare("P0", "P0", "none"));
                reports.push(cordon_probes::run_suite(
                    &NoSandbox, &agent, &prof, &targets, &filter,
                ));
            }
            "P1" => {
                let registry = Registry::for_host(Default::default())
                    .with_upstream_dns(crate::run::upstream_dns());
                let rt = registry
                    .get(cordon_policy::policy::Runtime::Native, Use::Call)
                    .map_err(|e| anyhow!("{e}"))?;
                let sb = RuntimeSandbox::new(
                    rt,
                    SandboxSpec::new("cordon-probe", [cordon_probes::runtime::AGENT_IN_JAIL]),
                );
                let prof = sb.profile("P1");
                subjects.push(report::Subject::bare("P1", "P1", "native"));
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
        let mut registry =
            Registry::for_host(Default::default()).with_upstream_dns(crate::run::upstream_dns());
        if let Some(cb) = crate::credentials::credentials_for(
            loaded.policy.tools.values(),
            a.providers.as_deref(),
        )? {
            registry = registry.with_credentials(cb);
        }
        let tools: Vec<&ToolPolicy> = match &a.tool {
            Some(t) => vec![
                loaded
                    .policy
                    .get(t)
                    .ok_or_else(|| anyhow!("no tool `{t}` in {}", path.display()))?,
            ],
            None => loaded.policy.tools.values().collect(),
        };
        let mut records = Vec::new();
        for p in tools {
            if p.profile == PolicyProfile::P0 {
                let prof = cordon_probes::Profile::unclaimed(format!("{} (P0)", p.name));
                subjects.push(report::Subject::tool(p));
                reports.push(cordon_probes::run_suite(
                    &NoSandbox, &agent, &prof, &targets, &filter,
                ));
                continue;
            }
            match suite_of(
                p,
                &registry,
                &agent,
                &targets,
                &filter,
                a.wasm_probe.as_deref(),
            ) {
                Ok(mut report) => {
                    // A loaded host: a run whose every unheld probe ran out
                    // of time says nothing either way; run it again with a
                    // longer wall (an escape is a verdict at once, never
                    // retried into a pass).
                    let mut wall = p
                        .limits
                        .as_ref()
                        .map_or(MAX_PROBE_WALL, |l| l.wall.as_secs());
                    while let Some(next) = retry_wall(finding(&report), wall) {
                        let mut longer = p.clone();
                        if let Some(l) = longer.limits.as_mut() {
                            l.wall = std::time::Duration::from_secs(next);
                        }
                        eprintln!(
                            "cordon probe: {}: every probe that did not hold ran out of time with a wall of {wall} s; again with {next} s",
                            p.name
                        );
                        let Ok(again) = suite_of(
                            &longer,
                            &registry,
                            &agent,
                            &targets,
                            &filter,
                            a.wasm_probe.as_deref(),
                        ) else {
                            break;
                        };
                        report = again;
                        wall = next;
                    }
                    // Only a run of the whole catalogue says the tool's
                    // sandbox holds.
                    if filter.only.is_empty() && filter.skip.is_empty() {
                        records.push(state::record_of(p, &report, state::now_rfc3339()));
                    }
                    subjects.push(report::Subject::tool(p));
                    reports.push(report);
                }
                Err(why) => skipped.push((p.name.clone(), why)),
            }
        }
        // For `cordon inventory`: a failure to record does not change the run's verdict.
        if !records.is_empty()
            && let Err(e) = state::state_dir().and_then(|d| state::save_probe_records(&d, records))
        {
            eprintln!(
                "cordon probe: the results could not be recorded for `cordon inventory`: {e:#}"
            );
        }
    }

    if a.json {
        let v: Vec<serde_json::Value> = reports
            .iter()
            .map(|r| serde_json::from_str(&r.render(Format::Json)).unwrap_or_default())
            .collect();
        let skipped_json: Vec<serde_json::Value> = skipped
            .iter()
            .map(|(t, why)| serde_json::json!({"tool": t, "not_probed": why}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"reports": v, "not_probed_tools": skipped_json})
            )?
        );
    } else {
        for r in &reports {
            print!("{}", r.render(Format::Human));
            println!();
        }
        for (t, why) in &skipped {
            println!("NOT PROBED tool {t}: {why}");
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
    if let (Some(path), Some(key), Some(host)) = (&a.report, &signer, &host) {
        let tools: Vec<(report::Subject, Report)> =
            subjects.into_iter().zip(reports.clone()).collect();
        let not_probed: Vec<report::NotProbed> = skipped
            .iter()
            .map(|(tool, why)| report::NotProbed {
                tool: tool.clone(),
                why: why.clone(),
            })
            .collect();
        let ended = state::now_rfc3339();
        let bytes = report::sign(
            &report::Run {
                started: &started,
                ended: &ended,
                host,
                tools: &tools,
                not_probed: &not_probed,
            },
            key,
        )?;
        report::write(path, &bytes)?;
        eprintln!(
            "cordon probe: wrote the signed report {} (key {})",
            path.display(),
            key.public().fingerprint()
        );
    }
    if reports.is_empty() && skipped.is_empty() {
        eprintln!("cordon probe: nothing was probed");
        return Ok(ExitCode::from(exit::USAGE));
    }
    if !skipped.is_empty() {
        eprintln!(
            "cordon probe: {} tool(s) could not be probed here; that counts against the run",
            skipped.len()
        );
    }
    Ok(ExitCode::from(combined_exit(&reports, skipped.len())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_probes::{Category, ProbeResult, Verdict};

    fn report(verdicts: &[(&str, Verdict)]) -> Report {
        Report {
            sandbox: "t".into(),
            profile: "t".into(),
            results: verdicts
                .iter()
                .map(|(p, v)| ProbeResult {
                    probe: p.to_string(),
                    category: if *p == "control" {
                        Category::Control
                    } else {
                        Category::Escape
                    },
                    verdict: *v,
                    evidence: String::new(),
                    duration: std::time::Duration::ZERO,
                    exit_code: None,
                    signal: None,
                    status: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_cause_shared_by_many_probes_is_said_once_with_the_count() {
        let mut r = report(&[
            ("control", Verdict::Held),
            ("host_fs", Verdict::Error),
            ("mount", Verdict::Error),
            ("network", Verdict::Error),
            ("uid", Verdict::Escaped),
            ("dns", Verdict::Skipped),
        ]);
        let cause = "the agent did not start: the sandbox failed (bind source /gone (for /gone) does not exist on the host)";
        for res in &mut r.results {
            res.evidence = match res.probe.as_str() {
                "uid" => "ran as uid 0".into(),
                _ => cause.into(),
            };
        }
        let (n, lines) = not_held_once(&r);
        assert_eq!(n, 4);
        assert_eq!(
            lines,
            vec![
                format!("3 probes Error (host_fs, mount, network): {cause}"),
                "uid Escaped: ran as uid 0".to_string(),
            ]
        );
        let loaded = cordon_policy::load_str(
            std::path::Path::new("m.yaml"),
            "tools:\n  t:\n    profile: P1\n    command: [/bin/true]\n",
        )
        .unwrap();
        let e = held_or_refused(&loaded.policy.tools["t"], r)
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches("does not exist on the host").count(), 1, "{e}");
        assert!(e.contains("4 probe(s)"), "{e}");
    }

    #[test]
    fn an_escape_wins_over_everything_else() {
        let held = report(&[("control", Verdict::Held), ("mount", Verdict::Held)]);
        let escaped = report(&[("control", Verdict::Held), ("mount", Verdict::Escaped)]);
        let error = report(&[("control", Verdict::Held), ("mount", Verdict::Error)]);
        assert_eq!(combined_exit(std::slice::from_ref(&held), 0), exit::OK);
        assert_eq!(
            combined_exit(&[held.clone(), error.clone()], 0),
            INCONCLUSIVE
        );
        assert_eq!(combined_exit(std::slice::from_ref(&held), 1), INCONCLUSIVE);
        assert_eq!(
            combined_exit(&[error.clone(), escaped.clone()], 0),
            exit::FINDING
        );
        assert_eq!(combined_exit(&[escaped, error], 3), exit::FINDING);
        assert_ne!(INCONCLUSIVE, exit::USAGE);
    }

    /// `report`, with the results named in `timed_out` stopped by the
    /// wall clock (or the harness) before they answered.
    fn timed(verdicts: &[(&str, Verdict)], timed_out: &[(&str, RunStatus)]) -> Report {
        let mut r = report(verdicts);
        for res in &mut r.results {
            if let Some((_, st)) = timed_out.iter().find(|(p, _)| *p == res.probe) {
                res.status = Some(st.clone());
            }
        }
        r
    }

    use cordon_probes::sandbox::{LimitKind, RunStatus};
    const WALL: RunStatus = RunStatus::Limit(LimitKind::Wall);

    #[test]
    fn a_run_out_of_time_is_inconclusive_never_held_nor_refused() {
        let held = report(&[("control", Verdict::Held), ("mount", Verdict::Skipped)]);
        assert_eq!(finding(&held), Finding::Held);
        // A probe stopped by the wall clock before it answered.
        let slow = timed(
            &[("control", Verdict::Held), ("net", Verdict::Error)],
            &[("net", WALL)],
        );
        assert_eq!(finding(&slow), Finding::Inconclusive);
        // The control itself out of time: every other probe void.
        let slow_control = timed(
            &[
                ("control", Verdict::Error),
                ("mount", Verdict::Void),
                ("net", Verdict::Void),
            ],
            &[("control", RunStatus::HarnessTimeout)],
        );
        assert_eq!(finding(&slow_control), Finding::Inconclusive);
        // An escape wins over a timeout.
        let leaky = timed(
            &[
                ("control", Verdict::Held),
                ("host_fs", Verdict::Escaped),
                ("net", Verdict::Error),
            ],
            &[("net", WALL)],
        );
        assert_eq!(finding(&leaky), Finding::Refused);
        // So does an error that is not for lack of time.
        let broken = timed(
            &[
                ("control", Verdict::Held),
                ("mount", Verdict::Error),
                ("net", Verdict::Error),
            ],
            &[("net", WALL)],
        );
        assert_eq!(finding(&broken), Finding::Refused);
        let other_limit = timed(
            &[("control", Verdict::Held), ("net", Verdict::Error)],
            &[("net", RunStatus::Limit(LimitKind::Memory))],
        );
        assert_eq!(finding(&other_limit), Finding::Refused);
        // A failed control not out of time: refused.
        let control = report(&[("control", Verdict::Error), ("mount", Verdict::Void)]);
        assert_eq!(finding(&control), Finding::Refused);
    }

    #[test]
    fn an_inconclusive_run_is_retried_with_a_longer_wall_up_to_a_bound() {
        assert_eq!(retry_wall(Finding::Inconclusive, 3), Some(6));
        assert_eq!(retry_wall(Finding::Inconclusive, 12), Some(24));
        assert_eq!(retry_wall(Finding::Inconclusive, 20), Some(24));
        assert_eq!(retry_wall(Finding::Inconclusive, 24), None);
        assert_eq!(retry_wall(Finding::Inconclusive, 0), Some(1));
        assert_eq!(retry_wall(Finding::Held, 3), None);
        assert_eq!(retry_wall(Finding::Refused, 3), None);

        let slow = timed(
            &[("control", Verdict::Held), ("net", Verdict::Error)],
            &[("net", WALL)],
        );
        let held = report(&[("control", Verdict::Held), ("net", Verdict::Held)]);
        let escaped = report(&[("control", Verdict::Held), ("net", Verdict::Escaped)]);
        // A scripted sequence of runs: what each wall would find.
        let script = |runs: Vec<Report>| {
            let mut runs = runs.into_iter();
            move |_wall: u64| runs.next().ok_or("ran more often than scripted")
        };

        // Inconclusive, then held: served.
        let (_, f, walls) = with_retries(3, script(vec![slow.clone(), held.clone()])).unwrap();
        assert_eq!((f, walls), (Finding::Held, vec![3, 6]));
        // Inconclusive twice, then an escape: refused, never a pass.
        let (r, f, walls) =
            with_retries(3, script(vec![slow.clone(), slow.clone(), escaped.clone()])).unwrap();
        assert_eq!((f, walls), (Finding::Refused, vec![3, 6, 12]));
        assert!(
            not_held_once(&r).1[0].starts_with("net Escaped"),
            "{:?}",
            not_held_once(&r)
        );
        // Still inconclusive at the longest wall: stops there, inconclusive.
        let (_, f, walls) = with_retries(3, script(vec![slow.clone(); 4])).unwrap();
        assert_eq!((f, walls), (Finding::Inconclusive, vec![3, 6, 12, 24]));
        // A verdict at once: no retry.
        let (_, f, walls) = with_retries(3, script(vec![escaped])).unwrap();
        assert_eq!((f, walls), (Finding::Refused, vec![3]));
        let (_, f, walls) = with_retries(2, script(vec![held])).unwrap();
        assert_eq!((f, walls), (Finding::Held, vec![2]));
    }
}
