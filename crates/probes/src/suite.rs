//! The harness: run the catalogue through a sandbox and judge each answer.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::agent::{AGENT_SUBCOMMAND, CANARY_NAME, CANARY_PREFIX};
use crate::report::{Category, ProbeResult, Report, Verdict};
use crate::sandbox::{ProbeRun, RunResult, RunStatus, Sandbox};
use crate::wire::{AgentEvent, AgentLine, AgentOutcome};

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct ProbeInfo {
    /// Name, as given to the agent and shown in reports.
    pub name: &'static str,
    /// Category.
    pub category: Category,
    /// One line on what it tries.
    pub summary: &'static str,
}

const fn p(name: &'static str, category: Category, summary: &'static str) -> ProbeInfo {
    ProbeInfo {
        name,
        category,
        summary,
    }
}

/// Every probe the suite runs, in order. `control` always runs first.
pub const CATALOGUE: &[ProbeInfo] = &[
    p(
        "control",
        Category::Control,
        "the agent runs, prints, writes /tmp, reads /usr",
    ),
    p(
        "network",
        Category::Escape,
        "TCP connect to the outside target",
    ),
    p(
        "metadata",
        Category::Escape,
        "TCP connect to the metadata address in every literal form",
    ),
    p(
        "host_loopback",
        Category::Escape,
        "TCP connect to a listener on the host's loopback",
    ),
    p(
        "private",
        Category::Escape,
        "TCP connect to a private-range target",
    ),
    p(
        "egress",
        Category::Escape,
        "only the profile's allowlisted host:port is reachable",
    ),
    p(
        "dns",
        Category::Escape,
        "UDP DNS to the resolver target and resolv.conf's nameservers",
    ),
    p(
        "host_fs",
        Category::Escape,
        "/etc/shadow, /root, /home, the user's home, /proc/1/root, /sys",
    ),
    p(
        "env",
        Category::Escape,
        "secret-looking variables and the harness's canary",
    ),
    p(
        "processes",
        Category::Escape,
        "processes beyond the sandbox's own",
    ),
    p(
        "write",
        Category::Escape,
        "create files in /usr, /etc, / and the agent's directory",
    ),
    p(
        "tmp_persist",
        Category::Escape,
        "a /tmp marker from one call seen by the next",
    ),
    p(
        "fresh_task",
        Category::Escape,
        "anything one task wrote (/tmp, /dev/shm, $HOME) or left running seen by the next",
    ),
    p("mount", Category::Escape, "mount a tmpfs"),
    p(
        "userns",
        Category::Escape,
        "unshare a nested user namespace",
    ),
    p(
        "ptrace",
        Category::Escape,
        "PTRACE_TRACEME, PTRACE_SEIZE of parent and pid 1",
    ),
    p(
        "raw_socket",
        Category::Escape,
        "AF_INET raw and AF_PACKET sockets",
    ),
    p("keyctl", Category::Escape, "kernel keyrings"),
    p("bpf", Category::Escape, "bpf(BPF_MAP_CREATE)"),
    p("io_uring", Category::Escape, "io_uring_setup"),
    p("uid", Category::Escape, "euid 0 that is host root"),
    p(
        "caps",
        Category::Escape,
        "a non-empty effective capability set",
    ),
    p("no_new_privs", Category::Escape, "no_new_privs not set"),
    p(
        "tty",
        Category::Escape,
        "a controlling terminal or a terminal on fd 0-2",
    ),
    p(
        "fds",
        Category::Escape,
        "descriptors inherited beyond 0, 1, 2",
    ),
    p(
        "memory",
        Category::Resource,
        "allocate and touch past the memory limit",
    ),
    p("fork", Category::Resource, "bounded fork bomb"),
    p("output", Category::Resource, "flood 100 MiB on stdout"),
    p("disk", Category::Resource, "fill /tmp"),
    p(
        "fd_limit",
        Category::Resource,
        "open descriptors until EMFILE",
    ),
    p(
        "time",
        Category::Resource,
        "busy loop past the wall-clock limit",
    ),
    p(
        "daemon",
        Category::Resource,
        "a double-forked sleeper that outlives the call",
    ),
];

/// Look a probe up by name.
pub fn probe_info(name: &str) -> Option<&'static ProbeInfo> {
    CATALOGUE.iter().find(|p| p.name == name)
}

/// The limits a profile claims; `None` is "no claim" (the probe then runs
/// to its default bound and escapes if nothing refuses it).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Limits {
    /// Memory cap in bytes.
    pub memory_bytes: Option<u64>,
    /// Task (pid) cap.
    pub tasks: Option<u64>,
    /// Wall-clock limit.
    pub wall: Option<Duration>,
    /// Output cap in bytes.
    pub output_bytes: Option<u64>,
    /// Writable scratch (/tmp) cap in bytes.
    pub disk_bytes: Option<u64>,
    /// Descriptor cap.
    pub fds: Option<u64>,
}

/// The profile under test: its name and the limits it claims.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Profile {
    /// Name shown in reports (e.g. "P1").
    pub name: String,
    /// Claimed limits.
    pub limits: Limits,
    /// Addresses the profile grants egress to (P2); empty: none.
    pub egress_allow: Vec<SocketAddr>,
    /// Paths inside the sandbox its configuration mounts on purpose (a
    /// manifest's `mounts`): `host_fs` reports a listing of one, or of the
    /// way to one, as the user's own mount rather than an escape.
    pub mounts: Vec<std::path::PathBuf>,
}

impl Profile {
    /// A profile that claims nothing (P0, or an unknown sandbox).
    pub fn unclaimed(name: impl Into<String>) -> Self {
        Profile {
            name: name.into(),
            limits: Limits::default(),
            egress_allow: Vec::new(),
            mounts: Vec::new(),
        }
    }
}

/// Where the network probes aim. The defaults are the real-world targets a
/// user checks on their own host; tests aim at stand-ins they run.
#[derive(Debug, Clone, Serialize)]
pub struct Targets {
    /// Outside host (default 1.1.1.1:443).
    pub outside: SocketAddr,
    /// Metadata address (default 169.254.169.254:80), dialled in every
    /// literal form.
    pub metadata: SocketAddrV4,
    /// IPv6 metadata address (default [fd00:ec2::254]:80).
    pub metadata_v6: Option<SocketAddr>,
    /// Private-range target (default 10.0.0.1:80).
    pub private: SocketAddr,
    /// DNS resolver (default 1.1.1.1:53).
    pub dns: SocketAddr,
    /// A listener on the host's loopback. `None`: the suite starts its own
    /// on 127.0.0.1 for the duration of the run.
    pub host_loopback: Option<SocketAddr>,
    /// The invoking user's home (default $HOME).
    pub home: Option<PathBuf>,
    /// Per-dial timeout inside the agent.
    pub connect_timeout: Duration,
}

impl Default for Targets {
    fn default() -> Self {
        Targets {
            outside: SocketAddr::from(([1, 1, 1, 1], 443)),
            metadata: SocketAddrV4::new(Ipv4Addr::new(169, 254, 169, 254), 80),
            metadata_v6: Some(SocketAddr::from((
                [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254],
                80,
            ))),
            private: SocketAddr::from(([10, 0, 0, 1], 80)),
            dns: SocketAddr::from(([1, 1, 1, 1], 53)),
            host_loopback: None,
            home: std::env::var_os("HOME").map(PathBuf::from),
            connect_timeout: Duration::from_secs(2),
        }
    }
}

/// Which probes to run. `control` always runs.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Run only these probe names or categories ("escape", "resource");
    /// empty means all.
    pub only: Vec<String>,
    /// Never run these probe names or categories.
    pub skip: Vec<String>,
}

impl Filter {
    fn names(&self, p: &ProbeInfo, list: &[String]) -> bool {
        let cat = match p.category {
            Category::Control => "control",
            Category::Escape => "escape",
            Category::Resource => "resource",
        };
        list.iter().any(|n| n == p.name || n == cat)
    }

    /// Whether a probe runs.
    pub fn allows(&self, p: &ProbeInfo) -> bool {
        if p.category == Category::Control {
            return true;
        }
        (self.only.is_empty() || self.names(p, &self.only)) && !self.names(p, &self.skip)
    }

    /// Names in `only`/`skip` that are neither a probe nor a category.
    pub fn unknown_names(&self) -> Vec<String> {
        self.only
            .iter()
            .chain(&self.skip)
            .filter(|n| {
                probe_info(n).is_none() && !["control", "escape", "resource"].contains(&n.as_str())
            })
            .cloned()
            .collect()
    }
}

/// Default outer bound on one run.
const OUTER_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a daemon may take to disappear after the call returned.
const DAEMON_GRACE: Duration = Duration::from_millis(1000);

/// A unique token for markers and canaries.
fn token() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:x}", std::process::id())
}

/// A TCP listener on the host's loopback that greets every connection, so
/// the host_loopback probe has something real to reach.
struct LoopbackListener {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

impl LoopbackListener {
    fn start() -> std::io::Result<Self> {
        let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = l.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let handle = thread::spawn(move || {
            for c in l.incoming() {
                if s2.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut c) = c {
                    let _ = c.write_all(b"cordon-probe host loopback listener\n");
                }
            }
        });
        Ok(LoopbackListener {
            addr,
            stop,
            handle: Some(handle),
        })
    }
}

impl Drop for LoopbackListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect(self.addr);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// What the agent's output says.
#[derive(Debug, Default)]
struct Parsed {
    started: bool,
    result: Option<AgentLine>,
    last_progress: Option<u64>,
}

fn parse(probe: &str, run: &RunResult) -> Parsed {
    let mut p = Parsed::default();
    let lines = run.stdout.lines().into_iter().chain(run.stderr.lines());
    for l in lines.filter_map(|l| AgentLine::parse(&l)) {
        if l.probe != probe {
            continue;
        }
        match (l.event, l.outcome) {
            (Some(AgentEvent::Start), _) => p.started = true,
            (Some(AgentEvent::Progress), _) => p.last_progress = l.value,
            (None, Some(_)) if p.result.is_none() => p.result = Some(l),
            _ => {}
        }
    }
    p
}

/// How the run ended, in words.
fn ending(run: &RunResult) -> String {
    let mut s = match (&run.status, run.exit_code, run.signal) {
        (RunStatus::Limit(k), _, _) => format!("stopped by the sandbox's {k:?} limit"),
        (RunStatus::HarnessTimeout, _, _) => "hung: the harness killed it".into(),
        (RunStatus::SandboxFailed, _, _) => "the sandbox failed".into(),
        (_, Some(c), _) => format!("exit {c}"),
        (_, _, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended without status".into(),
    };
    if let Some(r) = &run.reason {
        s.push_str(&format!(" ({r})"));
    }
    s
}

fn stderr_hint(run: &RunResult) -> String {
    let t = run.stderr.last_text(200);
    if t.is_empty() {
        String::new()
    } else {
        format!("; stderr: {t}")
    }
}

/// The agent's own result, checked against its exit code.
fn checked_result(p: &Parsed, run: &RunResult) -> Result<Option<AgentLine>, String> {
    let Some(r) = &p.result else {
        return Ok(None);
    };
    let Some(o) = r.outcome else {
        return Ok(None);
    };
    if run.exit_code != Some(o.exit_code()) {
        return Err(format!(
            "the agent printed {o:?} but the run ended with {}: result not trusted",
            ending(run)
        ));
    }
    Ok(Some(r.clone()))
}

const SIGSYS: i32 = 31;
const SIGKILL: i32 = 9;
const SIGXCPU: i32 = 24;
const SIGXFSZ: i32 = 25;

/// Judge an escape probe's run.
pub(crate) fn judge_escape(probe: &str, run: &RunResult) -> (Verdict, String) {
    let p = parse(probe, run);
    if run.status == RunStatus::HarnessTimeout {
        return (Verdict::Error, format!("no result: {}", ending(run)));
    }
    match checked_result(&p, run) {
        Err(e) => (Verdict::Error, e),
        Ok(Some(r)) => (
            match r.outcome {
                Some(AgentOutcome::Held) => Verdict::Held,
                Some(AgentOutcome::Escaped) => Verdict::Escaped,
                Some(AgentOutcome::Skipped) => Verdict::Skipped,
                _ => Verdict::Error,
            },
            r.evidence,
        ),
        Ok(None) if p.started && run.signal == Some(SIGSYS) => (
            Verdict::Held,
            "killed by SIGSYS during the probe (seccomp kill)".into(),
        ),
        Ok(None) if p.started => (
            Verdict::Error,
            format!(
                "the agent started but printed no result: {}{}",
                ending(run),
                stderr_hint(run)
            ),
        ),
        Ok(None) => (
            Verdict::Error,
            format!(
                "the agent did not start: {}{}",
                ending(run),
                stderr_hint(run)
            ),
        ),
    }
}

/// Units and claimed limit of a resource probe.
struct Bound {
    /// The claimed limit in the probe's unit.
    limit: Option<u64>,
    /// Allowed overshoot in the same unit.
    margin: u64,
    unit: &'static str,
}

fn bound(probe: &str, l: &Limits) -> Bound {
    const MIB: u64 = 1 << 20;
    let pct = |v: u64, min: u64| (v / 10).max(min);
    match probe {
        "memory" => {
            let lim = l.memory_bytes.map(|b| b / MIB);
            Bound {
                limit: lim,
                margin: lim.map_or(0, |v| pct(v, 32)),
                unit: "MiB",
            }
        }
        "fork" => Bound {
            limit: l.tasks,
            margin: l.tasks.map_or(0, |v| pct(v, 4)),
            unit: "processes",
        },
        "output" => Bound {
            limit: l.output_bytes,
            margin: l.output_bytes.map_or(0, |v| pct(v, 64 << 10)),
            unit: "bytes",
        },
        "disk" => {
            let lim = l.disk_bytes.map(|b| b / MIB);
            Bound {
                limit: lim,
                margin: lim.map_or(0, |v| pct(v, 8)),
                unit: "MiB",
            }
        }
        "fd_limit" => Bound {
            limit: l.fds,
            margin: l.fds.map_or(0, |v| pct(v, 16)),
            unit: "descriptors",
        },
        "time" => {
            let lim = l.wall.map(|w| w.as_secs().max(1));
            Bound {
                limit: lim,
                margin: lim.map_or(0, |v| (v / 2).max(2)),
                unit: "s",
            }
        }
        _ => Bound {
            limit: None,
            margin: 0,
            unit: "",
        },
    }
}

/// Judge a resource probe's run against the profile's claimed limits.
pub(crate) fn judge_resource(probe: &str, run: &RunResult, limits: &Limits) -> (Verdict, String) {
    let p = parse(probe, run);
    let b = bound(probe, limits);
    if !p.started {
        return (
            Verdict::Error,
            format!(
                "the agent did not start: {}{}",
                ending(run),
                stderr_hint(run)
            ),
        );
    }
    if run.status == RunStatus::HarnessTimeout {
        return (
            Verdict::Escaped,
            format!("no clean failure, the sandbox hung: {}", ending(run)),
        );
    }
    // How far the probe got, in its unit.
    let reached = |agent_value: Option<u64>| -> Option<u64> {
        match probe {
            "output" => Some(run.stdout.total),
            "time" => Some(run.duration.as_secs()),
            _ => agent_value.or(p.last_progress),
        }
    };
    let over = |v: Option<u64>| -> Option<String> {
        match (b.limit, v) {
            (Some(lim), Some(v)) if v > lim + b.margin => Some(format!(
                "reached {v} {} before being stopped, the profile claims {lim} {} (+{} margin)",
                b.unit, b.unit, b.margin
            )),
            _ => None,
        }
    };
    // A typed stop by the sandbox outranks the agent's own line, which it
    // may have printed just before the stop (a flood's write failing as
    // the sandbox cuts its output, then the kill): judged, as a stop
    // without a result is, by how far the probe got.
    let checked = match checked_result(&p, run) {
        Err(_) if matches!(run.status, RunStatus::Limit(_)) => Ok(None),
        c => c,
    };
    match checked {
        Err(e) => (Verdict::Error, e),
        Ok(Some(r)) => match r.outcome {
            Some(AgentOutcome::Escaped) => {
                if probe == "output" {
                    let got = run.stdout.total;
                    match b.limit {
                        Some(lim) if got <= lim + b.margin => (
                            Verdict::Held,
                            format!(
                                "the agent wrote {} bytes, the caller got {got} (the sandbox cut it)",
                                r.value.unwrap_or(0)
                            ),
                        ),
                        _ => (
                            Verdict::Escaped,
                            format!("{got} bytes of output reached the caller"),
                        ),
                    }
                } else {
                    (Verdict::Escaped, r.evidence)
                }
            }
            Some(AgentOutcome::Held) => match over(reached(r.value)) {
                Some(why) => (Verdict::Escaped, format!("{why}: {}", r.evidence)),
                None => (Verdict::Held, r.evidence),
            },
            Some(AgentOutcome::Skipped) => (Verdict::Skipped, r.evidence),
            _ => (Verdict::Error, r.evidence),
        },
        Ok(None) => {
            let stopped = matches!(run.status, RunStatus::Limit(_))
                || matches!(run.signal, Some(SIGKILL | SIGXCPU | SIGXFSZ | SIGSYS));
            if !stopped {
                return (
                    Verdict::Error,
                    format!(
                        "no result and no typed stop: {}{}",
                        ending(run),
                        stderr_hint(run)
                    ),
                );
            }
            let v = reached(None);
            let how_far = v.map_or(String::new(), |v| format!(" after {v} {}", b.unit));
            match over(v) {
                Some(why) => (Verdict::Escaped, format!("{why} ({})", ending(run))),
                None => (Verdict::Held, format!("{}{how_far}", ending(run))),
            }
        }
    }
}

/// Processes on this host whose command line carries `marker`.
fn processes_with(marker: &str) -> Vec<(i32, String)> {
    let me = std::process::id().to_string();
    let Ok(rd) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid: i32 = name.parse().ok()?;
            if name == me {
                return None;
            }
            let cmd = fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(marker).then(|| (pid, cmd.trim().to_string()))
        })
        .collect()
}

struct Runner<'a> {
    sb: &'a dyn Sandbox,
    agent: &'a Path,
    canary: (String, String),
}

impl Runner<'_> {
    fn run(&self, probe: &str, args: Vec<String>, timeout: Duration) -> Result<RunResult, String> {
        let mut argv = vec![AGENT_SUBCOMMAND.to_string(), probe.to_string()];
        argv.extend(args);
        let req = ProbeRun {
            agent: self.agent.to_path_buf(),
            args: argv,
            stdin: Vec::new(),
            env: vec![self.canary.clone()],
            timeout,
        };
        self.sb.run(&req).map_err(|e| e.to_string())
    }
}

fn result(
    info: &ProbeInfo,
    verdict: Verdict,
    evidence: String,
    run: Option<&RunResult>,
    started: Instant,
) -> ProbeResult {
    ProbeResult {
        probe: info.name.to_string(),
        category: info.category,
        verdict,
        evidence,
        duration: started.elapsed(),
        exit_code: run.and_then(|r| r.exit_code),
        signal: run.and_then(|r| r.signal),
        status: run.map(|r| r.status.clone()),
    }
}

/// Agent arguments of a probe.
fn args_for(
    probe: &str,
    profile: &Profile,
    t: &Targets,
    loopback: Option<SocketAddr>,
    marker: &str,
) -> Vec<String> {
    const MIB: u64 = 1 << 20;
    let ms = t.connect_timeout.as_millis().to_string();
    let kv = |k: &str, v: String| vec![format!("--{k}"), v];
    let l = &profile.limits;
    let mut a = match probe {
        "network" => kv("target", t.outside.to_string()),
        "metadata" => {
            let mut v = kv("target", t.metadata.to_string());
            v.extend(kv(
                "v6",
                t.metadata_v6
                    .map_or_else(|| "none".into(), |a| a.to_string()),
            ));
            v
        }
        "host_loopback" => loopback.map_or_else(Vec::new, |a| kv("target", a.to_string())),
        "private" => kv("target", t.private.to_string()),
        "egress" => kv(
            "allow",
            profile
                .egress_allow
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
        ),
        "dns" => kv("target", t.dns.to_string()),
        "host_fs" => {
            let mut v = t
                .home
                .as_ref()
                .map_or_else(Vec::new, |h| kv("home", h.display().to_string()));
            if !profile.mounts.is_empty() {
                let each: Vec<String> = profile
                    .mounts
                    .iter()
                    .map(|m| m.display().to_string())
                    .collect();
                v.extend(kv("mounts", each.join("\n")));
            }
            v
        }
        "memory" => kv(
            "mb",
            l.memory_bytes
                .map_or(1024, |b| 2 * (b / MIB) + 64)
                .to_string(),
        ),
        "fork" => kv("max", l.tasks.map_or(256, |n| 2 * n + 16).to_string()),
        "output" => kv(
            "mb",
            l.output_bytes
                .map_or(100, |b| (2 * b / MIB + 1).max(100))
                .to_string(),
        ),
        "disk" => kv(
            "mb",
            l.disk_bytes.map_or(256, |b| 2 * (b / MIB) + 16).to_string(),
        ),
        "fd_limit" => kv("max", l.fds.map_or(65536, |n| 2 * n + 64).to_string()),
        "time" => kv(
            "seconds",
            l.wall.map_or(3, |w| 2 * w.as_secs() + 2).to_string(),
        ),
        "daemon" => {
            let mut v = kv("marker", marker.to_string());
            v.extend(kv("seconds", "60".into()));
            v
        }
        _ => Vec::new(),
    };
    if matches!(
        probe,
        "network" | "metadata" | "host_loopback" | "private" | "dns" | "egress"
    ) {
        a.extend(kv("timeout-ms", ms));
    }
    a
}

/// The harness's bound on one run. It lies beyond the sandbox's own wall
/// limit, so that a probe the sandbox stops at that limit is reported as
/// that typed stop, not as a hang the harness had to cut (a slow host, an
/// emulated one, may need most of a long wall limit for a probe to meet
/// its other limits).
fn outer_timeout(probe: &str, profile: &Profile) -> Duration {
    let wall = profile.limits.wall;
    match probe {
        "time" => {
            wall.map_or(Duration::from_secs(3), |w| 2 * w + Duration::from_secs(2))
                + OUTER_TIMEOUT / 2
        }
        _ => wall.map_or(OUTER_TIMEOUT, |w| OUTER_TIMEOUT.max(w + OUTER_TIMEOUT / 2)),
    }
}

/// Run the control, then every probe the filter allows, through `sb`.
/// `agent` is the agent's host path (the `cordon` binary or the standalone
/// `cordon-probe-agent`).
pub fn run_suite(
    sb: &dyn Sandbox,
    agent: &Path,
    profile: &Profile,
    targets: &Targets,
    filter: &Filter,
) -> Report {
    let runner = Runner {
        sb,
        agent,
        canary: (
            CANARY_NAME.to_string(),
            format!("{CANARY_PREFIX}{}", token()),
        ),
    };
    let mut report = Report {
        sandbox: sb.name(),
        profile: profile.name.clone(),
        results: Vec::new(),
    };
    let listener = match targets.host_loopback {
        Some(_) => None,
        None => LoopbackListener::start().ok(),
    };
    let loopback = targets.host_loopback.or(listener.as_ref().map(|l| l.addr));

    // The positive control.
    let control_info = &CATALOGUE[0];
    let t0 = Instant::now();
    let (cv, ce, crun) = match runner.run("control", Vec::new(), OUTER_TIMEOUT) {
        Ok(r) => {
            let (v, e) = judge_escape("control", &r);
            (v, e, Some(r))
        }
        Err(e) => (
            Verdict::Error,
            format!("the sandbox could not run: {e}"),
            None,
        ),
    };
    let control_ok = cv == Verdict::Held;
    let cv = if control_ok {
        Verdict::Held
    } else {
        Verdict::Error
    };
    report
        .results
        .push(result(control_info, cv, ce.clone(), crun.as_ref(), t0));

    for info in CATALOGUE.iter().skip(1).filter(|p| filter.allows(p)) {
        let t0 = Instant::now();
        if !control_ok {
            report.results.push(result(
                info,
                Verdict::Void,
                format!("not run: the control failed ({ce})"),
                None,
                t0,
            ));
            continue;
        }
        let marker = format!("cordonprobe{}", token().replace('-', ""));
        let mut args = args_for(info.name, profile, targets, loopback, &marker);
        let timeout = outer_timeout(info.name, profile);
        if info.name == "tmp_persist" || info.name == "fresh_task" {
            report.results.push(tmp_persist(&runner, info, &marker, t0));
            continue;
        }
        // The fds probe gets a descriptor canary: a duplicate of stderr
        // without close-on-exec, open only for this run. A sandbox that
        // passes on the caller's descriptors shows it to the agent.
        let fd_canary = (info.name == "fds")
            .then(|| nix::unistd::dup(std::io::stderr()).ok())
            .flatten();
        if let Some(fd) = &fd_canary {
            args.extend(["--canary-fd".to_string(), fd.as_raw_fd().to_string()]);
        }
        let run = runner.run(info.name, args, timeout);
        drop(fd_canary);
        let run = match run {
            Ok(r) => r,
            Err(e) => {
                report.results.push(result(
                    info,
                    Verdict::Error,
                    format!("the sandbox could not run: {e}"),
                    None,
                    t0,
                ));
                continue;
            }
        };
        let (v, e) = match info.name {
            "daemon" => judge_daemon(&run, &marker),
            _ if info.category == Category::Resource => {
                judge_resource(info.name, &run, &profile.limits)
            }
            _ => judge_escape(info.name, &run),
        };
        report.results.push(result(info, v, e, Some(&run), t0));
    }
    drop(listener);
    for r in &mut report.results {
        if let Some(by) = sb.answered_by(&r.probe) {
            r.evidence = format!("{} [{by}]", r.evidence);
        }
    }
    report
}

/// A two-call probe (`tmp_persist`, `fresh_task`): call 1 leaves its
/// marks, call 2 (a later task) escapes if it sees any.
fn tmp_persist(runner: &Runner<'_>, info: &ProbeInfo, marker: &str, t0: Instant) -> ProbeResult {
    let args = |phase: &str| {
        vec![
            "--phase".to_string(),
            phase.to_string(),
            "--marker".to_string(),
            marker.to_string(),
        ]
    };
    let first = match runner.run(info.name, args("write"), OUTER_TIMEOUT) {
        Ok(r) => r,
        Err(e) => {
            return result(
                info,
                Verdict::Error,
                format!("call 1: the sandbox could not run: {e}"),
                None,
                t0,
            );
        }
    };
    let (v1, e1) = judge_escape(info.name, &first);
    if v1 != Verdict::Held {
        return result(
            info,
            Verdict::Error,
            format!("call 1 could not leave a marker: {e1}"),
            Some(&first),
            t0,
        );
    }
    match runner.run(info.name, args("check"), OUTER_TIMEOUT) {
        Ok(r) => {
            let (v, e) = judge_escape(info.name, &r);
            // The host copy of the marks, if the sandbox's /tmp is the
            // host's, and a sleeper that outlived its sandbox.
            let _ = fs::remove_file(format!("/tmp/.cordon-persist-{marker}"));
            let _ = fs::remove_file(format!("/.cordon-persist-{marker}"));
            let mut homes = vec![PathBuf::from("/tmp"), PathBuf::from("/dev/shm")];
            homes.extend(std::env::var_os("HOME").map(PathBuf::from));
            for d in homes {
                let _ = fs::remove_file(d.join(format!(".cordon-fresh-{marker}")));
            }
            for (pid, _) in processes_with(marker) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            result(info, v, e, Some(&r), t0)
        }
        Err(e) => result(
            info,
            Verdict::Error,
            format!("call 2: the sandbox could not run: {e}"),
            None,
            t0,
        ),
    }
}

/// The daemon probe: the agent's line only says the sleeper started; the
/// verdict is whether a process carrying the marker is still alive on the
/// host after the call (given a short grace for asynchronous teardown).
/// Survivors are killed by pid.
fn judge_daemon(run: &RunResult, marker: &str) -> (Verdict, String) {
    let (v, e) = judge_escape("daemon", run);
    if v != Verdict::Held {
        return (v, e);
    }
    let deadline = Instant::now() + DAEMON_GRACE;
    let mut left = processes_with(marker);
    while !left.is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
        left = processes_with(marker);
    }
    if left.is_empty() {
        return (
            Verdict::Held,
            format!("{e}; no process marked {marker} survived the call"),
        );
    }
    let mut killed = Vec::new();
    for (pid, _) in &left {
        if nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
        {
            killed.push(*pid);
        }
    }
    (
        Verdict::Escaped,
        format!(
            "{} process(es) outlived the call: {} (killed {killed:?})",
            left.len(),
            left.iter()
                .map(|(p, c)| format!("{p} `{c}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::Capture;

    fn run_with(
        stdout: &str,
        exit: Option<i32>,
        signal: Option<i32>,
        status: RunStatus,
    ) -> RunResult {
        let mut c = Capture::default();
        c.head = stdout.as_bytes().to_vec();
        c.total = c.head.len() as u64;
        c.complete = true;
        RunResult {
            exit_code: exit,
            signal,
            status,
            reason: None,
            duration: Duration::from_millis(5),
            stdout: c,
            stderr: Capture::default(),
        }
    }

    const START: &str = "{\"probe\":\"network\",\"event\":\"start\",\"value\":2}\n";

    #[test]
    fn nothing_printed_is_an_error_never_held() {
        let r = run_with("", Some(0), None, RunStatus::Exited);
        let (v, e) = judge_escape("network", &r);
        assert_eq!(v, Verdict::Error);
        assert!(e.contains("did not start"), "{e}");
        let r = run_with("garbage\n", Some(40), None, RunStatus::Exited);
        assert_eq!(judge_escape("network", &r).0, Verdict::Error);
    }

    #[test]
    fn exit_code_must_match_the_line() {
        let out =
            format!("{START}{{\"probe\":\"network\",\"outcome\":\"held\",\"evidence\":\"x\"}}\n");
        let r = run_with(&out, Some(40), None, RunStatus::Exited);
        assert_eq!(judge_escape("network", &r), (Verdict::Held, "x".into()));
        let r = run_with(&out, Some(0), None, RunStatus::Exited);
        assert_eq!(judge_escape("network", &r).0, Verdict::Error);
    }

    #[test]
    fn seccomp_kill_after_start_is_held_other_deaths_are_errors() {
        let r = run_with(START, None, Some(SIGSYS), RunStatus::Signaled);
        assert_eq!(judge_escape("network", &r).0, Verdict::Held);
        let r = run_with(START, None, Some(SIGKILL), RunStatus::Signaled);
        assert_eq!(judge_escape("network", &r).0, Verdict::Error);
        let r = run_with("", None, Some(SIGSYS), RunStatus::Signaled);
        assert_eq!(judge_escape("network", &r).0, Verdict::Error);
    }

    #[test]
    fn memory_kill_within_limit_holds_and_beyond_escapes() {
        let lim = Limits {
            memory_bytes: Some(64 << 20),
            ..Limits::default()
        };
        let mut out = String::from("{\"probe\":\"memory\",\"event\":\"start\",\"value\":2}\n");
        for mb in [8, 16, 24, 32, 40, 48, 56] {
            out.push_str(&format!(
                "{{\"probe\":\"memory\",\"event\":\"progress\",\"value\":{mb}}}\n"
            ));
        }
        let r = run_with(&out, None, Some(SIGKILL), RunStatus::Signaled);
        let (v, e) = judge_resource("memory", &r, &lim);
        assert_eq!(v, Verdict::Held, "{e}");
        assert!(e.contains("after 56 MiB"), "{e}");
        out.push_str("{\"probe\":\"memory\",\"event\":\"progress\",\"value\":400}\n");
        let r = run_with(&out, None, Some(SIGKILL), RunStatus::Signaled);
        let (v, e) = judge_resource("memory", &r, &lim);
        assert_eq!(v, Verdict::Escaped, "{e}");
        assert!(e.contains("claims 64 MiB"), "{e}");
        // Killed by something untyped (SIGTERM) is not a clean limit.
        let r = run_with(&out, None, Some(15), RunStatus::Signaled);
        assert_eq!(judge_resource("memory", &r, &lim).0, Verdict::Error);
    }

    #[test]
    fn a_typed_stop_outranks_a_result_printed_just_before_it() {
        use crate::sandbox::LimitKind;
        let lim = Limits {
            output_bytes: Some(1 << 20),
            ..Limits::default()
        };
        let out = "{\"probe\":\"output\",\"event\":\"start\",\"value\":2}\n{\"probe\":\"output\",\"outcome\":\"held\",\"evidence\":\"write failed\"}\n";
        // The flood cut by the sandbox's output limit, the agent's line
        // notwithstanding: held, by what reached the caller.
        let r = run_with(
            out,
            None,
            Some(SIGKILL),
            RunStatus::Limit(LimitKind::Output),
        );
        let (v, e) = judge_resource("output", &r, &lim);
        assert_eq!(v, Verdict::Held, "{e}");
        // Control: the same mismatch without a typed stop is not trusted.
        let r = run_with(out, None, Some(SIGKILL), RunStatus::Signaled);
        assert_eq!(judge_resource("output", &r, &lim).0, Verdict::Error);
    }

    #[test]
    fn a_hang_is_an_escape_for_resource_probes() {
        let r = run_with(
            "{\"probe\":\"time\",\"event\":\"start\",\"value\":2}\n",
            None,
            Some(SIGKILL),
            RunStatus::HarnessTimeout,
        );
        assert_eq!(
            judge_resource("time", &r, &Limits::default()).0,
            Verdict::Escaped
        );
    }

    #[test]
    fn the_harness_outlasts_the_sandboxs_wall_limit() {
        let mut p = Profile::unclaimed("P1");
        assert_eq!(outer_timeout("memory", &p), OUTER_TIMEOUT);
        p.limits.wall = Some(Duration::from_secs(10));
        assert_eq!(outer_timeout("memory", &p), OUTER_TIMEOUT);
        // A wall limit past the default bound: the sandbox's typed stop
        // comes first.
        p.limits.wall = Some(Duration::from_secs(90));
        for probe in ["memory", "fork", "output", "disk", "control"] {
            assert!(
                outer_timeout(probe, &p) > Duration::from_secs(90),
                "{probe}: {:?}",
                outer_timeout(probe, &p)
            );
        }
        assert_eq!(outer_timeout("time", &p), Duration::from_secs(212));
    }

    #[test]
    fn filter_by_name_and_category() {
        let f = Filter {
            only: vec!["resource".into(), "env".into()],
            skip: vec!["fork".into()],
        };
        let allowed: Vec<&str> = CATALOGUE
            .iter()
            .filter(|p| f.allows(p))
            .map(|p| p.name)
            .collect();
        assert!(allowed.contains(&"control"));
        assert!(allowed.contains(&"env"));
        assert!(allowed.contains(&"memory"));
        assert!(!allowed.contains(&"fork"));
        assert!(!allowed.contains(&"network"));
        let f = Filter {
            only: vec!["nope".into()],
            skip: vec![],
        };
        assert_eq!(f.unknown_names(), vec!["nope".to_string()]);
    }
}
