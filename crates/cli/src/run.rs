//! `cordon run` (a manifest's tool) and `cordon exec` (an ad-hoc P1 jail,
//! or a P3 gVisor sandbox).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use serde::Serialize;

use cordon_policy::policy::{
    Boot, Exec, Lifetime, Mechanism, Network, Output, Profile, Runtime, Seccomp, ToolPolicy,
};
use cordon_policy::units::{parse_cpu, parse_size_str};

use crate::exit;
use cordon_broker::{Broker, CallError, CallResult};

/// How the result is printed on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Label {
    /// The gated content as is (control characters and escapes stripped).
    None,
    /// Wrapped in nonce-marked `<untrusted-output>` markers.
    Wrapped,
    /// One JSON object: the envelope and the content.
    Envelope,
}

#[derive(Serialize)]
struct RunRecord<'a> {
    tool: &'a str,
    status: &'static str,
    exit_code: Option<i32>,
    signal: Option<i32>,
    duration_ms: u64,
    peak_memory_bytes: Option<u64>,
    output_bytes: u64,
    stderr: String,
    reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    egress: Vec<cordon_egress::EgressEvent>,
}

fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .read_to_end(&mut buf)
        .context("reading stdin")?;
    Ok(buf)
}

pub struct RunOpts {
    pub json: bool,
    /// Run the tool's conformance probes first and refuse if any does not hold.
    pub probe_first: bool,
    pub label: Label,
    pub audit: Option<PathBuf>,
    pub audit_fail_open: bool,
    /// The provider file (`None`: `$CORDON_PROVIDERS` or the default path).
    pub providers: Option<PathBuf>,
}

/// `CORDON_UPSTREAM_DNS` (where the egress doors resolve names), read
/// wherever a registry or broker is built.
pub fn upstream_dns() -> cordon_runtime::spec::UpstreamDns {
    use cordon_runtime::spec::UpstreamDns;
    UpstreamDns::from_var(std::env::var(UpstreamDns::VAR).ok())
}

pub fn run_tool(manifest: &Path, tool: &str, opts: &RunOpts) -> anyhow::Result<ExitCode> {
    let loaded = cordon_policy::load(manifest).map_err(|e| anyhow!("{e}"))?;
    let policy = crate::explain::tool_in(&loaded, manifest, tool)?;
    if opts.probe_first {
        let mut registry = cordon_runtime::Registry::for_host(Default::default())
            .with_upstream_dns(crate::run::upstream_dns());
        match crate::credentials::credentials_for(
            std::iter::once(policy),
            opts.providers.as_deref(),
        ) {
            Ok(Some(cb)) => registry = registry.with_credentials(cb),
            Ok(None) => {}
            Err(e) => {
                eprintln!("cordon: {e:#}");
                return Ok(ExitCode::from(exit::REFUSED));
            }
        }
        if let Err(e) = crate::probe::probe_tool(policy, &registry) {
            eprintln!("cordon: {e:#}");
            return Ok(ExitCode::from(exit::REFUSED));
        }
    }
    call_and_print(policy, opts)
}

pub fn call_and_print(policy: &ToolPolicy, opts: &RunOpts) -> anyhow::Result<ExitCode> {
    let credentials = match crate::credentials::credentials_for(
        std::iter::once(policy),
        opts.providers.as_deref(),
    ) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cordon: {e:#}");
            return Ok(ExitCode::from(exit::REFUSED));
        }
    };
    let mut bopts =
        cordon_broker::BrokerOptions::one_shot(opts.audit.clone(), opts.audit_fail_open);
    bopts.credentials = credentials.clone();
    bopts.upstream_dns = upstream_dns();
    let broker = match Broker::new(bopts) {
        Ok(b) => std::sync::Arc::new(b),
        Err(e) => {
            eprintln!("cordon: {e}");
            return Ok(ExitCode::from(exit::AUDIT_FAILED));
        }
    };
    for w in broker.warnings() {
        eprintln!("cordon: warning: {w}");
    }
    // SIGTERM or SIGINT from here on: the credentials are revoked and the
    // end audited before cordon exits (128 + the signal).
    crate::interrupt::on_signal(crate::interrupt::Interrupted {
        broker: std::sync::Arc::downgrade(&broker),
        credentials: credentials.clone(),
        tool: policy.name.clone(),
        profile: cordon_broker::profile_name(policy.profile),
    })?;
    let input = read_stdin()?;
    let called = broker.call(policy, input);
    // The call's lease is revoked when it ends; nothing outlives the process.
    if let Some(cb) = &credentials
        && let Err(e) = cb.revoke_all("cordon is exiting")
    {
        eprintln!("cordon: warning: {e}");
    }
    let code = match called {
        Ok(r) => print_result(policy, &r, opts)?,
        Err(e) => {
            if opts.json {
                let rec = RunRecord {
                    tool: &policy.name,
                    status: match &e {
                        CallError::Setup(_) => "setup_failed",
                        CallError::Audit(_) => "audit_failed",
                        CallError::Refused(_) => "refused",
                    },
                    exit_code: None,
                    signal: None,
                    duration_ms: 0,
                    peak_memory_bytes: None,
                    output_bytes: 0,
                    stderr: String::new(),
                    reason: e.to_string(),
                    output: None,
                    warnings: vec![],
                    egress: vec![],
                };
                println!("{}", serde_json::to_string(&rec)?);
            }
            eprintln!("cordon: {e}");
            e.exit_code()
        }
    };
    // A record of this run that could not be written (a re-mint's, a
    // revocation's) fails the run, unless --audit-fail-open: the tool's
    // result stands, but the exit status says the audit log lacks it.
    let unwritten = broker.auditor().unwritten_count();
    if unwritten > 0 && code == exit::OK && !opts.audit_fail_open {
        eprintln!(
            "cordon: {unwritten} audit record(s) of this run could not be written (said above); exit {}",
            exit::AUDIT_FAILED
        );
        return Ok(ExitCode::from(exit::AUDIT_FAILED));
    }
    Ok(ExitCode::from(code))
}

fn status_name(r: &CallResult) -> &'static str {
    use cordon_broker::Status::*;
    match r.outcome.status {
        Ok => match &r.gated {
            Some(Err(_)) => "gate_refused",
            _ => "ok",
        },
        Exited | Killed => "tool_failed",
        TimedOut => "timed_out",
        MemoryLimit => "memory_limit",
        TaskLimit => "task_limit",
        OutputCap => "output_cap",
    }
}

fn print_result(policy: &ToolPolicy, r: &CallResult, opts: &RunOpts) -> anyhow::Result<u8> {
    let o = &r.outcome;
    // Tool stderr and reasons pass the gate too: an error string is an
    // exfiltration channel.
    let meta =
        cordon_gate::ToolMeta::new(&policy.name, cordon_broker::profile_name(policy.profile));
    let stderr = cordon_gate::gate_error(&meta, &o.stderr).content.to_text();
    let reason = match &r.gated {
        Some(Err(refusal)) if o.status == cordon_broker::Status::Ok => {
            format!("{}: {refusal}", policy.name)
        }
        _ => o.reason.clone(),
    };
    let mut stdout = std::io::stdout().lock();
    if opts.json {
        let output = match &r.gated {
            Some(Ok(g)) => Some(g.render_envelope()),
            _ => None,
        };
        let rec = RunRecord {
            tool: &policy.name,
            status: status_name(r),
            exit_code: o.exit_code,
            signal: o.signal,
            duration_ms: o.duration.as_millis() as u64,
            peak_memory_bytes: o.peak_memory_bytes,
            output_bytes: o.output_bytes,
            stderr,
            reason: reason.clone(),
            output,
            warnings: o.warnings.clone(),
            egress: r.egress.clone(),
        };
        writeln!(stdout, "{}", serde_json::to_string(&rec)?)?;
    } else {
        if let Some(Ok(g)) = &r.gated {
            match (opts.label, &g.content) {
                (_, cordon_gate::Content::Binary { bytes, .. }) => stdout.write_all(bytes)?,
                (Label::None, c) => stdout.write_all(c.to_text().as_bytes())?,
                (Label::Wrapped, _) => stdout.write_all(g.render_wrapped().as_bytes())?,
                (Label::Envelope, _) => writeln!(stdout, "{}", g.render_envelope())?,
            }
        }
        if !stderr.is_empty() {
            eprint!("{stderr}");
            if !stderr.ends_with('\n') {
                eprintln!();
            }
        }
        for w in &o.warnings {
            eprintln!("cordon: warning: {w}");
        }
        for e in r
            .egress
            .iter()
            .filter(|e| e.decision == cordon_egress::Decision::Refused)
        {
            eprintln!("cordon: {}", e.reason);
        }
    }
    stdout.flush()?;
    let code = r.exit_code();
    if code != exit::OK && !opts.json {
        eprintln!("cordon: {reason}");
    }
    Ok(code)
}

/// The egress flags of `cordon exec` and `cordon proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct EgressArgs {
    /// Allow egress to HOST:PORT through the broker's doors. Repeatable.
    #[arg(long = "egress", value_name = "HOST:PORT")]
    pub egress: Vec<String>,
    /// Allow any public destination on ports 80 and 443 (the filtering proxy).
    #[arg(long = "egress-proxy", conflicts_with = "egress")]
    pub egress_proxy: bool,
    /// Pin NAME to IP, skipping DNS (private services, tests). Repeatable.
    #[arg(long = "resolve", value_name = "NAME=IP")]
    pub resolve: Vec<String>,
    /// Admit a private range the doors would otherwise refuse. Repeatable.
    #[arg(long = "allow-cidr", value_name = "CIDR")]
    pub allow_cidr: Vec<String>,
}

impl EgressArgs {
    /// The network these flags grant, validated as the manifest is.
    pub fn network(&self) -> anyhow::Result<Network> {
        let mut resolve = BTreeMap::new();
        for r in &self.resolve {
            let (n, ip) = r
                .split_once('=')
                .ok_or_else(|| anyhow!("--resolve {r}: write NAME=IP"))?;
            resolve.insert(n.to_string(), ip.to_string());
        }
        for e in &self.egress {
            cordon_policy::resolve::check_host_port(e).map_err(|m| anyhow!("--egress: {m}"))?;
        }
        for c in &self.allow_cidr {
            cordon_policy::resolve::check_cidr(c).map_err(|m| anyhow!("--allow-cidr: {m}"))?;
        }
        if self.egress_proxy {
            Ok(Network::Proxy {
                resolve,
                allow_cidrs: self.allow_cidr.clone(),
            })
        } else if !self.egress.is_empty() {
            Ok(Network::Allowlist {
                allow: self.egress.clone(),
                resolve,
                allow_cidrs: self.allow_cidr.clone(),
            })
        } else if !resolve.is_empty() || !self.allow_cidr.is_empty() {
            Err(anyhow!(
                "--resolve and --allow-cidr apply only with --egress or --egress-proxy"
            ))
        } else {
            Ok(Network::None)
        }
    }
}

/// The runtime of an ad-hoc `cordon exec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecRuntime {
    /// cordon's own jail (P1).
    Native,
    /// A fresh gVisor application kernel (P3), destroyed at the end.
    Gvisor,
    /// A microVM (P3): a guest kernel of its own under QEMU, restored from
    /// a template snapshot, destroyed at the end; needs `--image`.
    Microvm,
}

/// How an ad-hoc microVM's guest starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExecBoot {
    /// Restored from the image's template snapshot.
    Snapshot,
    /// Booted from nothing, no snapshot made or kept.
    Cold,
}

/// `cordon exec` flags.
#[derive(clap::Args, Debug)]
pub struct ExecArgs {
    /// Profile whose defaults apply: P1 (native), or P3 (with
    /// `--runtime gvisor`, its default there).
    #[arg(long)]
    pub profile: Option<String>,
    /// The runtime: native (the P1 jail), gvisor or microvm (a P3
    /// sandbox; microvm runs an `--image` and, without working KVM here,
    /// needs `--accept kvm`).
    #[arg(long, value_enum, default_value = "native")]
    pub runtime: ExecRuntime,
    /// With `--runtime microvm`: `snapshot` (default) restores the guest
    /// from the image's template snapshot (made on first use); `cold`
    /// boots it from nothing and keeps no snapshot.
    #[arg(long, value_enum)]
    pub boot: Option<ExecBoot>,
    /// Memory cap, e.g. 512M.
    #[arg(long)]
    pub memory: Option<String>,
    /// Task (process and thread) cap.
    #[arg(long)]
    pub tasks: Option<u64>,
    /// Wall-clock seconds.
    #[arg(long)]
    pub wall: Option<u64>,
    /// CPU quota, e.g. 100% (one core).
    #[arg(long)]
    pub cpu: Option<String>,
    /// Stdout cap in bytes (K/M suffixes allowed).
    #[arg(long = "output-bytes")]
    pub output_bytes: Option<String>,
    /// Size of the writable /tmp.
    #[arg(long)]
    pub disk: Option<String>,
    /// Extra read-only bind, SRC or SRC:DST. Repeatable.
    #[arg(long = "ro-bind")]
    pub ro_bind: Vec<String>,
    /// Environment variable K=V passed in. Repeatable.
    #[arg(long = "env")]
    pub env: Vec<String>,
    #[command(flatten)]
    pub net: EgressArgs,
    /// Print the run record as JSON instead of the output.
    #[arg(long)]
    pub json: bool,
    /// Audit log file (`-` for stderr).
    #[arg(long, env = "CORDON_AUDIT")]
    pub audit: Option<PathBuf>,
    /// Go on when the audit record cannot be written (default: the call
    /// fails with status 22 and its output is withheld).
    #[arg(long, env = "CORDON_AUDIT_FAIL_OPEN")]
    pub audit_fail_open: bool,
    /// Also require this mechanism to be fully enforced (repeatable):
    /// namespaces, readonly_root, descriptors, network, seccomp, landlock,
    /// cgroup, kvm.
    #[arg(long = "require", value_name = "MECHANISM")]
    pub require: Vec<String>,
    /// Accept this mechanism partial or missing (repeatable).
    #[arg(long = "accept", value_name = "MECHANISM")]
    pub accept: Vec<String>,
    /// The command and its arguments.
    /// Run in an image from the store (NAME@sha256:HEX) instead of on the
    /// host's root; without a command after `--`, the image's entrypoint.
    #[arg(long, value_name = "NAME@sha256:HEX")]
    pub image: Option<String>,
    #[arg(last = true, required_unless_present = "image")]
    pub cmd: Vec<String>,
}

/// The policy of an ad-hoc `cordon exec`: P1 defaults (P3 with
/// `--runtime gvisor`) and the flags.
pub fn exec_policy(a: &ExecArgs) -> anyhow::Result<ToolPolicy> {
    let (profile, runtime) = match (a.runtime, a.profile.as_deref()) {
        (ExecRuntime::Native, None | Some("P1")) => (Profile::P1, Runtime::Native),
        (ExecRuntime::Gvisor, None | Some("P3")) => (Profile::P3, Runtime::Gvisor),
        (ExecRuntime::Microvm, None | Some("P3")) => (Profile::P3, Runtime::Microvm),
        (ExecRuntime::Native, Some(p)) => {
            return Err(anyhow!(
                "--profile {p}: ad-hoc runs use the P1 jail, or P3 with `--runtime gvisor`; declare other profiles in a manifest"
            ));
        }
        (ExecRuntime::Gvisor | ExecRuntime::Microvm, Some(p)) => {
            return Err(anyhow!(
                "--profile {p}: `--runtime {}` runs P3; declare other profiles in a manifest",
                if a.runtime == ExecRuntime::Gvisor {
                    "gvisor"
                } else {
                    "microvm"
                }
            ));
        }
    };
    let boot = match (a.boot, runtime) {
        (None | Some(ExecBoot::Snapshot), Runtime::Microvm) => Some(Boot::Snapshot),
        (Some(ExecBoot::Cold), Runtime::Microvm) => Some(Boot::Cold),
        (None, _) => None,
        (Some(_), _) => {
            return Err(anyhow!(
                "--boot applies only with `--runtime microvm` (how the guest starts)"
            ));
        }
    };
    let mut l = cordon_policy::resolve::default_limits(profile)
        .ok_or_else(|| anyhow!("{profile:?} has default limits"))?;
    if let Some(m) = &a.memory {
        l.memory_bytes = parse_size_str(m).map_err(|e| anyhow!("--memory: {e}"))?;
    }
    if let Some(t) = a.tasks {
        l.tasks = t;
    }
    if let Some(w) = a.wall {
        l.wall = std::time::Duration::from_secs(w);
    }
    if let Some(c) = &a.cpu {
        l.cpu_percent = Some(parse_cpu(c).map_err(|e| anyhow!("--cpu: {e}"))?);
    }
    if let Some(o) = &a.output_bytes {
        l.output_bytes = parse_size_str(o).map_err(|e| anyhow!("--output-bytes: {e}"))?;
    }
    if let Some(d) = &a.disk {
        l.disk_bytes = parse_size_str(d).map_err(|e| anyhow!("--disk: {e}"))?;
    }
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("PATH".into(), cordon_policy::resolve::SANDBOX_PATH.into());
    env.insert("HOME".into(), "/tmp".into());
    env.insert("LANG".into(), "C.UTF-8".into());
    for kv in &a.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow!("--env {kv}: write K=V"))?;
        env.insert(k.into(), v.into());
    }
    let mounts = a
        .ro_bind
        .iter()
        .map(|b| {
            let (src, dst) = match b.split(':').collect::<Vec<_>>().as_slice() {
                [src] => (*src, *src),
                [src, dst] => (*src, *dst),
                _ => return Err(anyhow!("--ro-bind {b}: write SRC or SRC:DST")),
            };
            if !src.starts_with('/') || !dst.starts_with('/') {
                return Err(anyhow!("--ro-bind {b}: paths must be absolute"));
            }
            Ok(cordon_policy::policy::Mount {
                src: src.into(),
                dst: dst.into(),
                writable: false,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let network = a.net.network()?;
    let accept = mechanisms("--accept", &a.accept)?;
    // As in a manifest: a microVM under emulation is accepted by name.
    let vm = (runtime == Runtime::Microvm).then_some(Mechanism::Kvm);
    let mut require: Vec<Mechanism> = cordon_policy::resolve::default_requirements(profile)
        .iter()
        .copied()
        .chain(vm)
        .chain(mechanisms("--require", &a.require)?)
        .filter(|m| !accept.contains(m))
        .collect();
    require.sort();
    require.dedup();
    Ok(ToolPolicy {
        name: "exec".into(),
        profile,
        description: String::new(),
        runtime,
        exec: match &a.image {
            None => Exec::Command {
                argv: a.cmd.clone(),
            },
            Some(i) => {
                let (reference, digest) =
                    cordon_policy::resolve::split_digest(i).map_err(|e| anyhow!("--image: {e}"))?;
                Exec::Image {
                    reference,
                    digest,
                    command: (!a.cmd.is_empty()).then(|| a.cmd.clone()),
                }
            }
        },
        limits: Some(l),
        network,
        secrets: vec![],
        tls_passthrough: vec![],
        mounts,
        workspace: None,
        state: None,
        env,
        lifetime: Lifetime::Call,
        boot,
        pool: None,
        input: cordon_policy::policy::Input {
            stdin: None,
            encoding: cordon_policy::policy::Encoding::Text,
            argv: vec![],
            json: false,
        },
        input_schema: None,
        output_schema: None,
        output: Output::text(),
        seccomp: Seccomp::DenyList,
        require,
        accept,
        concurrency: None,
    })
}

/// `--require`/`--accept` values.
fn mechanisms(flag: &str, names: &[String]) -> anyhow::Result<Vec<Mechanism>> {
    names
        .iter()
        .map(|n| {
            Mechanism::ALL
                .into_iter()
                .find(|m| m.name() == n)
                .ok_or_else(|| {
                    let all: Vec<&str> = Mechanism::ALL.iter().map(|m| m.name()).collect();
                    anyhow!("{flag} {n}: not a mechanism (one of {})", all.join(", "))
                })
        })
        .collect()
}
