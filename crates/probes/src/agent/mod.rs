//! The probe agent: the program that runs INSIDE a sandbox and asks the
//! kernel, directly, for what the sandbox should refuse.
//!
//! It needs nothing from the sandbox's image (no shell, no python): the
//! harness maps this very binary in read-only and runs
//! `AGENT __probe-agent NAME [--key value]...`. Each probe prints a start
//! event, then one result line, and exits with the outcome's code (see
//! [`crate::wire`]).

mod host;
mod kernel;
mod net;
mod resource;

use std::collections::BTreeMap;
use std::io::{self, Write};

use nix::errno::Errno;

use crate::wire::{AgentEvent, AgentLine, AgentOutcome, EXIT_USAGE};

pub use net::parse_inet_aton;

/// The first argument the agent accepts (and skips) so that both the
/// `cordon` binary and the standalone agent take the same command line.
pub const AGENT_SUBCOMMAND: &str = "__probe-agent";

/// Prefix of every environment canary value the harness plants.
pub const CANARY_PREFIX: &str = "cordon-canary-";
/// Name of the environment canary the harness plants.
pub const CANARY_NAME: &str = "HOST_SECRET_TOKEN";

/// Entry point: `args` is the command line after the program name (a
/// leading `__probe-agent` is skipped). Returns the process exit code.
pub fn main(args: &[String]) -> i32 {
    let args = match args.first() {
        Some(a) if a == AGENT_SUBCOMMAND => &args[1..],
        _ => args,
    };
    let Some((name, rest)) = args.split_first() else {
        eprintln!("usage: {AGENT_SUBCOMMAND} PROBE [--key value]...");
        return EXIT_USAGE;
    };
    let opts = match Opts::parse(rest) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{AGENT_SUBCOMMAND} {name}: {e}");
            return EXIT_USAGE;
        }
    };
    // Internal helpers the probes spawn; they print nothing on stdout.
    match name.as_str() {
        "_sleeper" => return resource::sleeper(&opts),
        "_daemon_mid" => return resource::daemon_mid(&opts),
        "_traceme" => return kernel::traceme_child(),
        _ => {}
    }
    let mut out = Out::new(name);
    out.start();
    let v = match name.as_str() {
        "control" => host::control(),
        "network" => net::network(&opts),
        "metadata" => net::metadata(&opts),
        "host_loopback" => net::host_loopback(&opts),
        "private" => net::private(&opts),
        "egress" => net::egress(&opts),
        "dns" => net::dns(&opts),
        "host_fs" => host::host_fs(&opts),
        "env" => host::env(),
        "processes" => host::processes(),
        "write" => host::write(),
        "tmp_persist" => host::tmp_persist(&opts),
        "fresh_task" => host::fresh_task(&opts),
        "mount" => kernel::mount(),
        "userns" => kernel::userns(),
        "ptrace" => kernel::ptrace(),
        "raw_socket" => kernel::raw_socket(),
        "keyctl" => kernel::keyctl(),
        "bpf" => kernel::bpf(),
        "io_uring" => kernel::io_uring(),
        "uid" => host::uid(),
        "caps" => host::caps(),
        "no_new_privs" => host::no_new_privs(),
        "tty" => host::tty(),
        "fds" => host::fds(&opts),
        "memory" => resource::memory(&opts, &mut out),
        "fork" => resource::fork(&opts, &mut out),
        "output" => resource::output(&opts, &mut out),
        "disk" => resource::disk(&opts, &mut out),
        "fd_limit" => resource::fd_limit(&opts, &mut out),
        "time" => resource::time(&opts, &mut out),
        "daemon" => resource::daemon(&opts),
        other => Verdict::error(format!("unknown probe {other:?}")),
    };
    out.finish(v)
}

/// `--key value` options after the probe name.
#[derive(Debug, Default)]
pub(crate) struct Opts(BTreeMap<String, String>);

impl Opts {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut m = BTreeMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let Some(key) = k.strip_prefix("--") else {
                return Err(format!("expected --key, got {k:?}"));
            };
            let Some(v) = it.next() else {
                return Err(format!("--{key} needs a value"));
            };
            m.insert(key.to_string(), v.clone());
        }
        Ok(Opts(m))
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// A numeric option, or `default` when absent. A malformed value is an
    /// error, never silently the default.
    pub(crate) fn num(&self, key: &str, default: u64) -> Result<u64, String> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{key} {v:?} is not a number")),
        }
    }
}

/// A probe's conclusion.
#[derive(Debug, Clone)]
pub(crate) struct Verdict {
    pub outcome: AgentOutcome,
    pub evidence: String,
    pub value: Option<u64>,
}

impl Verdict {
    pub(crate) fn held(evidence: impl Into<String>) -> Self {
        Verdict {
            outcome: AgentOutcome::Held,
            evidence: evidence.into(),
            value: None,
        }
    }
    pub(crate) fn escaped(evidence: impl Into<String>) -> Self {
        Verdict {
            outcome: AgentOutcome::Escaped,
            evidence: evidence.into(),
            value: None,
        }
    }
    pub(crate) fn error(evidence: impl Into<String>) -> Self {
        Verdict {
            outcome: AgentOutcome::Error,
            evidence: evidence.into(),
            value: None,
        }
    }
    pub(crate) fn skipped(evidence: impl Into<String>) -> Self {
        Verdict {
            outcome: AgentOutcome::Skipped,
            evidence: evidence.into(),
            value: None,
        }
    }
    pub(crate) fn with_value(mut self, v: u64) -> Self {
        self.value = Some(v);
        self
    }

    /// Combine sub-checks: escaped if any escaped, else error if any
    /// errored, else held. The evidence lists the deciding findings first.
    pub(crate) fn combine(findings: Vec<Finding>) -> Self {
        let pick = |k: Kind| -> Vec<String> {
            findings
                .iter()
                .filter(|f| f.kind == k)
                .map(|f| f.text.clone())
                .collect()
        };
        let escaped = pick(Kind::Escaped);
        let errors = pick(Kind::Error);
        let held = pick(Kind::Held);
        if !escaped.is_empty() {
            Verdict::escaped(escaped.join("; "))
        } else if !errors.is_empty() {
            let mut all = errors;
            all.extend(held);
            Verdict::error(all.join("; "))
        } else if held.is_empty() {
            Verdict::error("no check ran")
        } else {
            Verdict::held(held.join("; "))
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Held,
    Escaped,
    Error,
}

/// One sub-check of a probe.
#[derive(Debug, Clone)]
pub(crate) struct Finding {
    pub kind: Kind,
    pub text: String,
}

impl Finding {
    pub(crate) fn held(t: impl Into<String>) -> Self {
        Finding {
            kind: Kind::Held,
            text: t.into(),
        }
    }
    pub(crate) fn escaped(t: impl Into<String>) -> Self {
        Finding {
            kind: Kind::Escaped,
            text: t.into(),
        }
    }
    pub(crate) fn error(t: impl Into<String>) -> Self {
        Finding {
            kind: Kind::Error,
            text: t.into(),
        }
    }
}

/// The agent's stdout writer: start, progress, result.
pub(crate) struct Out {
    probe: String,
    /// Set once stdout refused a write (e.g. the output probe's pipe was
    /// closed); the result then goes to stderr too.
    stdout_broken: bool,
}

impl Out {
    fn new(probe: &str) -> Self {
        Out {
            probe: probe.to_string(),
            stdout_broken: false,
        }
    }

    fn line(&mut self, l: &AgentLine) {
        let s = l.to_json();
        let mut so = io::stdout().lock();
        if writeln!(so, "{s}").and_then(|()| so.flush()).is_err() {
            self.stdout_broken = true;
        }
    }

    fn start(&mut self) {
        let l = AgentLine {
            probe: self.probe.clone(),
            outcome: None,
            event: Some(AgentEvent::Start),
            evidence: String::new(),
            value: Some(u64::from(std::process::id())),
        };
        self.line(&l);
    }

    pub(crate) fn progress(&mut self, value: u64) {
        let l = AgentLine {
            probe: self.probe.clone(),
            outcome: None,
            event: Some(AgentEvent::Progress),
            evidence: String::new(),
            value: Some(value),
        };
        self.line(&l);
    }

    /// Note that stdout failed outside `line` (the output probe writes raw).
    pub(crate) fn mark_stdout_broken(&mut self) {
        self.stdout_broken = true;
    }

    fn finish(mut self, v: Verdict) -> i32 {
        let l = AgentLine {
            probe: self.probe.clone(),
            outcome: Some(v.outcome),
            event: None,
            evidence: v.evidence,
            value: v.value,
        };
        self.line(&l);
        if self.stdout_broken {
            eprintln!("{}", l.to_json());
        }
        v.outcome.exit_code()
    }
}

/// The errno name of an I/O error ("ENETUNREACH"), or its text when it
/// carries no errno (e.g. a timeout measured in user space).
pub(crate) fn errname(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => format!("{:?}", Errno::from_raw(n)),
        None => e.to_string(),
    }
}

/// The errno of an I/O error, if any.
pub(crate) fn errno_of(e: &io::Error) -> Option<Errno> {
    e.raw_os_error().map(Errno::from_raw)
}

/// A per-process unique suffix for files the agent creates.
pub(crate) fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:x}", std::process::id())
}

/// This agent's own executable file, for checking whether it can be
/// overwritten (the agent's, not its loader's, when a loader runs it).
pub(crate) fn own_exe() -> io::Result<std::path::PathBuf> {
    if let Some((_, agent)) = run_by_loader() {
        return Ok(agent);
    }
    std::env::current_exe().or_else(|e| {
        std::env::args_os()
            .next()
            .map(std::path::PathBuf::from)
            .filter(|p| p.is_absolute())
            .ok_or(e)
    })
}

/// When this agent was started through its ELF loader
/// (`LOADER --library-path DIR AGENT ...`, as in an image root that lacks
/// the host's libraries: see [`crate::runtime`]): the loader, which is the
/// process's executable, and the agent, which is its `argv[0]`.
fn run_by_loader() -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let exe = std::env::current_exe().ok()?;
    let arg0 = std::path::PathBuf::from(std::env::args_os().next()?);
    let name = exe.file_name()?.to_string_lossy().into_owned();
    let loader = name.starts_with("ld-") || name.starts_with("ld.so");
    (loader && arg0.is_absolute() && arg0 != exe).then_some((exe, arg0))
}

/// A command that starts another copy of this agent with `args` after
/// [`AGENT_SUBCOMMAND`]: through the same loader, with the libraries of
/// the loader's directory, when a loader runs this one.
pub(crate) fn agent_command(args: &[&str]) -> io::Result<std::process::Command> {
    let mut c = match run_by_loader() {
        Some((loader, agent)) => {
            let mut c = std::process::Command::new(&loader);
            c.arg("--library-path")
                .arg(loader.parent().unwrap_or(std::path::Path::new("/")))
                .arg(agent);
            c
        }
        None => std::process::Command::new(own_exe()?),
    };
    c.arg(AGENT_SUBCOMMAND).args(args);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opts_parse_and_reject() {
        let o = Opts::parse(&["--target".into(), "1.2.3.4:5".into()]).unwrap();
        assert_eq!(o.get("target"), Some("1.2.3.4:5"));
        assert!(Opts::parse(&["target".into()]).is_err());
        assert!(Opts::parse(&["--target".into()]).is_err());
        let o = Opts::parse(&["--mb".into(), "x".into()]).unwrap();
        assert!(o.num("mb", 1).is_err());
        assert_eq!(o.num("other", 7), Ok(7));
    }

    #[test]
    fn combine_prefers_escape_then_error() {
        let v = Verdict::combine(vec![Finding::held("a"), Finding::escaped("b")]);
        assert_eq!(v.outcome, AgentOutcome::Escaped);
        assert_eq!(v.evidence, "b");
        let v = Verdict::combine(vec![Finding::held("a"), Finding::error("c")]);
        assert_eq!(v.outcome, AgentOutcome::Error);
        let v = Verdict::combine(vec![Finding::held("a"), Finding::held("d")]);
        assert_eq!(v.outcome, AgentOutcome::Held);
        assert_eq!(v.evidence, "a; d");
        assert_eq!(Verdict::combine(vec![]).outcome, AgentOutcome::Error);
    }
}
